"""Helpers for the recovery tests: a `command` provider whose launch script brings up a "machine"
on this host (a fresh ORCH_HOME that runs `orch adopt URL --job UID --yes` and `orch daemon
start`, as the docs' bootstrap does), the controller (`orch watch`) as a subprocess, and losing a
launched machine (SIGKILL its daemon and jobs, delete its folder)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import tomli_w
from tests.daemon_harness import kill_leftover_attempts, wait_for

from orchestrator.objectstore import claims as cl
from orchestrator.objectstore.remote import Remote
from orchestrator.home.paths import Home
from orchestrator.home.watch_lock import STATE_NAME

from tests.bucket_key import KEY_ENV, put_in_environment

# The provider's launch command: a machine is "launch-<n>", booting in the background (the
# command returns at once, as `aws ec2 run-instances` does); its market and jobs written down.
LAUNCH_SH = r"""#!/bin/bash
set -eu
m="$MACHINES/launch-$ORCH_RECOVERY_LAUNCH"
mkdir -p "$m/home"
echo "launch_called $(date +%s.%N)" >> "$m/times"
cp "$MACHINES/machine-config.toml" "$m/home/config.toml"
echo "$ORCH_RECOVERY_MARKET" > "$m/market"
echo "$ORCH_RECOVERY_JOBS" > "$m/jobs"
sleep "${LAUNCH_DELAY:-0}"
nohup bash "$MACHINES/bootstrap.sh" "$m" > "$m/bootstrap.log" 2>&1 < /dev/null &
echo "launch-$ORCH_RECOVERY_LAUNCH"
"""

# What the new machine runs at boot (docs/recovery.md): adopt without --force, start the daemon.
BOOTSTRAP_SH = r"""#!/bin/bash
set -eu
export ORCH_HOME="$1/home"
echo "booted $(date +%s.%N)" >> "$1/times"
for uid in $ORCH_RECOVERY_JOBS; do
  # A planned move's new machine comes up before the holder hands the job over: wait for it.
  for try in $(seq 600); do
    if out=$("$PYTHON" -m orchestrator.cli adopt "$ORCH_RECOVERY_URL" --job "$uid" --yes 2>&1); then break; fi
    case "$out" in *"still owned by"*) sleep 0.2 ;; *) echo "$out" >&2; exit 1 ;; esac
  done
done
echo "adopted $(date +%s.%N)" >> "$1/times"
"$PYTHON" -m orchestrator.cli daemon start
echo "daemon_started $(date +%s.%N)" >> "$1/times"
"""


def machines_folder(tmp: Path, machine_config: Path) -> Path:
    folder = tmp / "machines"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "launch.sh").write_text(LAUNCH_SH)
    (folder / "bootstrap.sh").write_text(BOOTSTRAP_SH)
    shutil.copy(machine_config, folder / "machine-config.toml")
    return folder


def controller_home(tmp: Path, url: str, recovery: dict[str, Any], **storage: Any) -> Path:
    root = tmp / "controller"
    root.mkdir(parents=True, exist_ok=True)
    put_in_environment()  # `orch watch` verifies with the test key its config names
    if url.startswith("file://"):  # the bucket's folder, as a user makes it (`orch launch` refuses a missing one)
        Path(url.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
    cfg: dict[str, Any] = {"storage": {"url": url, "signing_key_env": KEY_ENV, **storage}, "recovery": recovery}
    notifiers = recovery.pop("notifiers", None)
    if notifiers:
        cfg["notifiers"] = notifiers
    (root / "config.toml").write_text(tomli_w.dumps(cfg))
    return root


def env(**extra: str) -> dict[str, str]:
    e = dict(os.environ)
    e.update(
        {
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": "1",
            "PYTHON": sys.executable,
        }
    )
    e.pop("ORCH_HOME", None)
    e.pop("ORCH_CONFIG", None)
    e.update(extra)
    return e


class Watch:
    """`orch --home H watch` in the background, its output in a file."""

    def __init__(self, root: Path, extra_env: Optional[dict[str, str]] = None):
        self.root = root
        self.extra_env = extra_env or {}
        self.procs: list[subprocess.Popen] = []

    def start(self) -> subprocess.Popen:
        out = open(self.root / f"watch-{len(self.procs) + 1}.out", "wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", "--home", str(self.root), "watch"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env(**self.extra_env),
        )
        out.close()
        self.procs.append(proc)
        return proc

    def passes(self) -> int:
        """The passes the running controller (the one started last) has recorded: home/watch_lock.py's
        record_pass, written when a pass is done: its outcomes, its outbox delivered. 0 before its first."""
        try:
            state = json.loads((self.root / STATE_NAME).read_text())
        except (OSError, ValueError):
            return 0
        return int(state.get("passes") or 0) if self.procs and state.get("pid") == self.procs[-1].pid else 0

    def wait_passes(self, more: int, timeout: float = 60.0) -> None:
        """Wait until the running controller has made `more` whole passes after this call: what it
        would do in them (launch again, send again) has then had its chance, so an assertion that
        nothing happened means something on a stalled machine too."""
        target = self.passes() + more + 1  # the pass under way may have read the bucket before now
        wait_for(
            lambda: self.passes() >= target, timeout, interval=0.05, what=lambda: f"{more} passes\n{self.output()}"
        )

    def output(self) -> str:
        return "\n".join((self.root / f"watch-{i + 1}.out").read_text(errors="replace") for i in range(len(self.procs)))

    def kill9(self) -> None:
        proc = self.procs[-1]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)


def claims(remote: Remote, uid: str) -> list[cl.Claim]:
    return cl.read_claims(remote, uid)


def lose_machine(root: Path) -> None:
    """SIGKILL a launched machine's daemon and jobs, then delete its folder."""
    from orchestrator.home.daemon_lock import running_pid

    home = Home(root / "home")
    pid = running_pid(home)
    if pid and pid > 0:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    kill_leftover_attempts(home)
    shutil.rmtree(root)


def stop_machine(root: Path) -> None:
    """Teardown: stop a launched machine's daemon (if its folder is still there)."""
    if root.exists():
        lose_machine(root)


def times(root: Path) -> dict[str, float]:
    """What the launch script and the bootstrap wrote down: launch_called, booted, adopted, daemon_started."""
    out: dict[str, float] = {}
    for line in (root / "times").read_text().splitlines():
        name, _, value = line.partition(" ")
        out.setdefault(name, float(value))
    return out


def read_market(root: Path) -> str:
    return (root / "market").read_text().strip()


def json_of(text: str) -> Any:
    return json.loads(text)


class Hook:
    """A generic webhook on loopback that records each event it accepted."""

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.events: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.events.append(json.loads(body))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)
        self._thread.start()

    def kinds(self) -> list[str]:
        return sorted(e["event"] for e in self.events)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
