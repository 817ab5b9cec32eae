"""`orch dashboard`: a read-only web page served by orch itself (standard library
ThreadingHTTPServer; the page, its script and its styles ship in static/, no CDN). GET only.
Bound to loopback by default; on any other address every request must carry a token printed
once at start (?token= on the first visit sets a cookie, or `Authorization: Bearer`)."""

from __future__ import annotations

import hmac
import ipaddress
import json
import math
import re
import secrets
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any, Callable, Optional
from urllib.parse import parse_qs, urlsplit

from ..spec.config import Config
from ..contract import PROVENANCE_FILES, provenance_dir
from ..model.errors import JobNotFound, OrchError
from ..home.paths import Home
from ..redaction import redact
from ..store import Store
from ..store.sweeps import SweepNotFound
from . import data, sweep_data

STATIC = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "chart.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
COOKIE = "orch_dashboard"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def same_token(given: str, token: str) -> bool:
    """Constant-time comparison of what a request carries, whatever its characters: compare_digest
    refuses a non-ASCII str, and a header decoded as latin-1 may hold any byte."""
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), token.encode())


def _json_safe(value: Any) -> Any:
    """NaN and infinity are not JSON: they become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


class Dashboard:
    def __init__(self, home: Home, config: Config, *, token: Optional[str] = None, ttl: float = 1.0):
        self.home, self.config, self.token = home, config, token
        self.store = Store(home.db, read_only=True)
        self.snapshot = data.Snapshot(ttl)
        self.assets = {
            name: resources.files(__package__).joinpath("static").joinpath(name).read_bytes() for name in STATIC
        }

    def provenance_file(self, job_id: int, name: str) -> Optional[bytes]:
        return _provenance_file(self.home, job_id, name)

    def api(self, path: str) -> tuple[int, Any]:
        now = time.time()
        try:
            if path == "/api/queue":
                return 200, self.snapshot.get("queue", lambda: data.queue(self.store, self.home, self.config, now))
            if path == "/api/bill":
                return 200, self.snapshot.get("bill", lambda: data.bill(self.store, self.home, self.config, now))
            if path == "/api/sweeps":
                return 200, self.snapshot.get("sweeps", lambda: sweep_data.sweeps(self.store))
            m = re.fullmatch(r"/api/sweep/([0-9]{1,18})", path)  # a longer id names no sweep: 404
            if m:
                sweep_id = int(m.group(1))
                return 200, self.snapshot.get(
                    ("sweep", sweep_id),
                    lambda: sweep_data.sweep(self.store, self.home, sweep_id, self.config.pricing.currency),
                )
            m = re.fullmatch(r"/api/job/([0-9]{1,18})", path)  # a longer id names no job: 404
            if m:
                job_id = int(m.group(1))
                return 200, self.snapshot.get(
                    ("job", job_id), lambda: data.job(self.store, self.home, self.config, job_id, now)
                )
        except (JobNotFound, SweepNotFound) as exc:
            return 404, {"error": str(exc)}
        except OrchError as exc:
            return 503, {"error": str(exc)}
        return 404, {"error": f"no such page: {path}"}


def _provenance_file(home: Home, job_id: int, name: str) -> Optional[bytes]:
    """A file of runs/ID/provenance/ as text, redacted like the events (a diff may hold a key)."""
    if name not in PROVENANCE_FILES:
        return None
    try:
        raw = (provenance_dir(home.run_dir(job_id)) / name).read_bytes()
    except OSError:
        return None
    return redact(raw.decode("utf-8", "replace")).encode()


def make_handler(dash: Dashboard) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "orch-dashboard"
        sys_version = ""

        def log_message(self, format: str, *args: Any) -> None:  # quiet: a poll every few seconds
            pass

        def _send(self, status: int, body: bytes, ctype: str, extra: Optional[dict[str, str]] = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("Content-Security-Policy", CSP)
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Referrer-Policy", "no-referrer")
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _token_ok(self, query: dict[str, list[str]]) -> tuple[bool, bool]:
            """(allowed, came from the query string)."""
            if dash.token is None:
                return True, False
            given = (query.get("token") or [""])[0]
            if given and same_token(given, dash.token):
                return True, True
            auth = self.headers.get("Authorization", "")
            if auth.startswith("Bearer ") and same_token(auth[7:].strip(), dash.token):
                return True, False
            for part in self.headers.get("Cookie", "").split(";"):
                name, _, value = part.strip().partition("=")
                if name == COOKIE and same_token(value, dash.token):
                    return True, False
            return False, False

        def _host_ok(self) -> bool:
            # On loopback, a page on another site must not reach us through DNS rebinding: the
            # Host header has to name this machine (an SSH tunnel's localhost:PORT does).
            if dash.token is not None:
                return True
            host = (self.headers.get("Host") or "").strip()
            name = host[1:].split("]")[0] if host.startswith("[") else host.rsplit(":", 1)[0] if ":" in host else host
            return name in LOOPBACK_NAMES

        def do_GET(self) -> None:  # noqa: N802
            try:
                self._get()
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client went away
            except Exception as exc:  # whatever a request holds, it gets an answer, not a dropped connection
                self._send(500, f"orch dashboard: {type(exc).__name__}\n".encode(), "text/plain; charset=utf-8")

        def _get(self) -> None:
            url = urlsplit(self.path)
            query = parse_qs(url.query)
            if not self._host_ok():
                return self._send(403, b"orch dashboard: unexpected Host header\n", "text/plain; charset=utf-8")
            ok, from_query = self._token_ok(query)
            if not ok:
                return self._send(
                    401,
                    b"orch dashboard: this address needs the token `orch dashboard` printed when "
                    b"it started: open /?token=TOKEN once\n",
                    "text/plain; charset=utf-8",
                    {"WWW-Authenticate": "Bearer"},
                )
            extra = {}
            if from_query:  # the first visit: remember it for the page's own requests
                extra["Set-Cookie"] = f"{COOKIE}={dash.token}; Path=/; HttpOnly; SameSite=Strict"
            path = url.path
            m = re.fullmatch(r"/api/job/([0-9]{1,18})/provenance/([a-z.-]{1,40})", path)
            if m:
                text = dash.provenance_file(int(m.group(1)), m.group(2))
                if text is None:
                    return self._send(404, b"no such provenance file\n", "text/plain; charset=utf-8", extra)
                return self._send(200, text, "text/plain; charset=utf-8", extra)
            if path.startswith("/api/"):
                status, payload = dash.api(path)
                body = json.dumps(_json_safe(payload), default=str).encode()
                return self._send(status, body, "application/json", extra)
            name = "index.html" if path in ("/", "/index.html") else path.lstrip("/").removeprefix("static/")
            if name in STATIC:
                return self._send(200, dash.assets[name], STATIC[name], extra)
            return self._send(404, b"not found\n", "text/plain; charset=utf-8")

        do_HEAD = do_GET

        def _refuse(self) -> None:
            self._send(405, b"orch dashboard is read-only\n", "text/plain; charset=utf-8", {"Allow": "GET, HEAD"})

        do_POST = do_PUT = do_DELETE = do_PATCH = _refuse

    return Handler


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]):
        if ":" in address[0]:
            import socket

            self.address_family = socket.AF_INET6
        super().__init__(address, handler)


def build(home: Home, config: Config, host: str, port: int) -> tuple[Server, Optional[str]]:
    token = None if is_loopback(host) else secrets.token_urlsafe(24)
    dash = Dashboard(home, config, token=token)
    return Server((host, port), make_handler(dash)), token


def serve(
    home: Home, config: Config, host: str = "127.0.0.1", port: int = 8787, out: Callable[[str], None] = print
) -> None:
    try:
        server, token = build(home, config, host, port)
    except OSError as exc:
        raise OrchError(f"cannot listen on {host}:{port}: {exc.strerror or exc} (try another --port)") from None
    bound_port = server.server_address[1]
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{bound_port}/"
    if token is None:
        out(f"orch dashboard: {url} (read-only; Ctrl-C stops it)")
    else:
        out(f"orch dashboard: {url}?token={token}")
        out(
            f"  {host} is not loopback: every request needs this token (printed only now); "
            "anyone who has it sees your jobs"
        )
    sys.stdout.flush()
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


__all__ = ["serve", "build", "is_loopback", "Dashboard"]
