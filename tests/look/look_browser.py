"""Real headless Chromium (Debian's `chromium`) for the dashboard tests, driven from the command
line: --dump-dom prints the DOM after the page's scripts ran, --screenshot saves a PNG. The flags
keep it off the network (the machine has none) and out of any profile."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, Optional

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--hide-scrollbars",
    "--mute-audio",
]

needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="needs Debian's chromium (scripts/system-deps.d/chromium.sh)"
)


def _run(args: list[str], timeout: float) -> str:
    with tempfile.TemporaryDirectory(prefix="orch-chromium-") as profile:
        proc = subprocess.run(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    if proc.returncode != 0:
        raise AssertionError(f"chromium exited {proc.returncode}: {proc.stderr[-2000:]}")
    return proc.stdout


def dump_dom(url: str, *, budget_ms: int = 4000, timeout: float = 90) -> str:
    """The DOM after `budget_ms` of (virtual) time: the page has fetched and drawn its data."""
    return _run([f"--virtual-time-budget={budget_ms}", "--dump-dom", url], timeout)


def screenshot(
    url: str, path: Path, *, size: tuple[int, int] = (1280, 1700), budget_ms: int = 4000, timeout: float = 90
) -> Path:
    _run(
        [f"--virtual-time-budget={budget_ms}", f"--window-size={size[0]},{size[1]}", f"--screenshot={path}", url],
        timeout,
    )
    assert path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"no screenshot at {path}"
    return path


class Element:
    def __init__(self, tag: str, attrs: dict[str, Optional[str]]):
        self.tag, self.attrs, self.text = tag, attrs, ""

    def has_class(self, name: str) -> bool:
        return name in (self.attrs.get("class") or "").split()


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.elements: list[Element] = []
        self._open: list[Element] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, Optional[str]]]) -> None:
        el = Element(tag, dict(attrs))
        self.elements.append(el)
        if tag not in ("br", "img", "meta", "link", "input", "hr", "path", "line", "circle"):
            self._open.append(el)

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self._open) - 1, -1, -1):
            if self._open[i].tag == tag:
                del self._open[i:]
                return

    def handle_data(self, data: str) -> None:
        for el in self._open:
            el.text += data


def parse(html: str) -> list[Element]:
    collector = _Collector()
    collector.feed(html)
    return collector.elements


def path_vertices(d: str) -> int:
    """Vertices of an SVG path made of M/L commands."""
    return len(re.findall(r"[ML]", d or ""))


class DashboardProcess:
    """`orch --home H dashboard --host HOST --port 0` as a subprocess; `url` from its first line."""

    def __init__(self, home_root: Path, host: str = "127.0.0.1"):
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "orchestrator.cli",
                "--home",
                str(home_root),
                "dashboard",
                "--host",
                host,
                "--port",
                "0",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        self.lines: list[str] = []
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline() if self.proc.stdout else ""
            if not line:
                break
            self.lines.append(line.rstrip("\n"))
            if "orch dashboard:" in line:
                if "token=" in line and self.proc.stdout:  # and the line that says what the token is for
                    self.lines.append(self.proc.stdout.readline().rstrip("\n"))
                break
        match = re.search(r"(http://\S+)", "\n".join(self.lines))
        if not match:
            self.close()
            raise AssertionError(
                f"no URL from orch dashboard: {self.lines} {self.proc.stderr.read() if self.proc.stderr else ''}"
            )
        self.url = match.group(1)
        self.port = int(re.search(r":(\d+)/", self.url).group(1))  # type: ignore[union-attr]
        token = re.search(r"token=([\w-]+)", self.url)
        self.token = token.group(1) if token else None

    def local(self, path: str = "/") -> str:
        """The same server reached through 127.0.0.1 (whatever address it is bound to)."""
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def find(elements: list[Element], tag: Optional[str] = None, **attrs: Any) -> list[Element]:
    out = []
    for el in elements:
        if tag and el.tag != tag:
            continue
        if all(el.attrs.get(k.replace("_", "-")) == (None if v is None else str(v)) for k, v in attrs.items()):
            out.append(el)
    return out
