"""The AutoDL and SkyPilot launch scripts of docs/recovery-providers.md, run by a real bash: the
AutoDL one against a loopback server speaking the request and envelope the page describes (taken
from a third-party client, not AutoDL itself), the SkyPilot one with a `sky` that records its
arguments; then what each new machine would run, with an `orch` that records its arguments."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

from orchestrator.recovery.provider import launched_from_output

DOC = Path(__file__).resolve().parents[2] / "docs" / "recovery-providers.md"
URL = "s3://orch-bucket/lab"
RECORD = '#!/bin/sh\necho "$(basename "$0") $*" >> "$CALLS"\n'


def _block(first_lines: str) -> str:
    for block in DOC.read_text().split("```")[1::2]:
        body = block.split("\n", 1)[1]
        if body.startswith(first_lines):
            return body
    raise AssertionError(f"no block starting with {first_lines!r} in {DOC.name}")


def _bin(tmp_path: Path, *names: str, text: str = RECORD) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    for name in names:
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    return folder


def _env(tmp_path: Path, bin_dir: Path, **extra: str) -> dict[str, str]:
    return {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HOME": str(tmp_path / "home"),
        "CALLS": str(tmp_path / "calls"),
        "ORCH_RECOVERY_URL": URL,
        "ORCH_RECOVERY_JOBS": "Ab_12 cd-34",
        "ORCH_RECOVERY_LAUNCH": "3",
        **extra,
    }


def _calls(tmp_path: Path) -> list[str]:
    path = tmp_path / "calls"
    return path.read_text().splitlines() if path.exists() else []


class FakeAutoDL:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.reply: dict[str, Any] = {"code": "Success", "msg": "", "data": "uuid-1234", "request_id": "r1"}


@pytest.fixture
def autodl() -> Iterator[tuple[FakeAutoDL, str]]:
    fake = FakeAutoDL()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path == "/api/v1/dev/instance/pro/create":
                fake.bodies.append(json.loads(body))
                fake.headers.append({k.lower(): v for k, v in self.headers.items()})
                data = json.dumps(fake.reply).encode()
                self.send_response(200)
            else:
                data = b"not found"
                self.send_response(404)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield fake, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_autodl_script_creates_a_pro_instance_whose_start_command_adopts_and_starts(autodl, tmp_path):
    fake, endpoint = autodl
    script = _block("#!/bin/bash\n# launch-autodl.sh")
    env = _env(tmp_path, _bin(tmp_path, "orch"), AUTODL_TOKEN="tok-secret", AUTODL_IMAGE="image-uuid-9")
    env.update(AUTODL_API=endpoint, ORCH_RECOVERY_MARKET="spot")

    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-2:] == ["autodl instance uuid-1234", "instance=uuid-1234"]
    assert launched_from_output(done.stdout).instance_id == "uuid-1234"  # what stop and alive get
    body = fake.bodies[-1]
    assert fake.headers[-1]["authorization"] == "tok-secret"
    assert (body["req_gpu_amount"], body["image_uuid"], body["cuda_v_from"]) == (1, "image-uuid-9", 118)
    assert body["instance_name"] == "orch-launch-3"
    assert "tok-secret" not in done.stdout + done.stderr

    # What the new instance runs after boot.
    subprocess.run(["bash", "-c", body["start_command"]], env=env, check=True, timeout=30)
    assert _calls(tmp_path) == [
        f"orch adopt {URL} --job Ab_12 --yes",
        f"orch adopt {URL} --job cd-34 --yes",
        "orch daemon start",
    ]


def test_the_autodl_script_fails_with_autodls_own_message(autodl, tmp_path):
    fake, endpoint = autodl
    fake.reply = {"code": "InsufficientBalance", "msg": "余额不足", "data": None}
    script = _block("#!/bin/bash\n# launch-autodl.sh")
    env = _env(tmp_path, _bin(tmp_path, "orch"), AUTODL_TOKEN="tok", AUTODL_IMAGE="img", AUTODL_API=endpoint)

    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)

    assert done.returncode != 0
    assert "AutoDL refused the launch: InsufficientBalance: 余额不足" in done.stderr


@pytest.mark.parametrize("market, flag", [("spot", "--use-spot"), ("on-demand", "--no-use-spot")])
def test_the_skypilot_script_launches_a_named_cluster_on_the_market_asked(tmp_path, market, flag):
    folder = tmp_path / "scripts"
    folder.mkdir()
    (folder / "launch-sky.sh").write_text(_block("#!/bin/bash\n# launch-sky.sh"))
    env = _env(tmp_path, _bin(tmp_path, "sky"), ORCH_RECOVERY_MARKET=market)

    done = subprocess.run(["bash", str(folder / "launch-sky.sh")], env=env, capture_output=True, text=True)

    assert done.returncode == 0, done.stderr
    cluster = "orch-ab-12-3"  # lower case, _ -> -: a name SkyPilot accepts
    assert done.stdout.strip().splitlines() == [f"sky cluster {cluster} ({market})", f"instance={cluster}"]
    assert launched_from_output(done.stdout).instance_id == cluster
    assert _calls(tmp_path) == [
        f"sky launch -y -d --down -c {cluster} {flag} --env ORCH_RECOVERY_URL --env ORCH_RECOVERY_JOBS "
        f"{folder}/orch-worker.yaml"
    ]


def test_the_skypilot_task_adopts_runs_while_orch_has_work_then_stops(tmp_path):
    task = _block("# orch-worker.yaml")
    run = task.split("run: |\n", 1)[1]
    run = "\n".join(line[2:] for line in run.splitlines())  # the YAML block's indentation
    orch = (
        '#!/bin/sh\necho "orch $*" >> "$CALLS"\n'
        'if [ "$1" = status ]; then n=$(grep -c "orch status" "$CALLS"); [ "$n" -ge 2 ] && echo "[]" || echo "[{}]"; fi\n'
    )
    env = _env(tmp_path, _bin(tmp_path, "orch", text=orch))
    _bin(tmp_path, "sleep", text="#!/bin/sh\nexit 0\n")  # the task's `sleep 60`, at once

    subprocess.run(["bash", "-c", run], env=env, check=True, timeout=30)

    assert _calls(tmp_path) == [
        f"orch adopt {URL} --job Ab_12 --yes",
        f"orch adopt {URL} --job cd-34 --yes",
        "orch daemon start",
        "orch status --json",
        "orch status --json",
        "orch daemon stop",
    ]
    assert (tmp_path / "home" / ".orch" / "config.toml").read_text() == f'[storage]\nurl = "{URL}"\n'


def test_the_skypilot_task_keeps_its_machine_while_an_adoption_is_pending(tmp_path):
    """A planned move's machine: its adopt was left pending and `orch status` lists nothing yet; the
    task waits for the hand-over instead of stopping the daemon (and SkyPilot tearing it down)."""
    task = _block("# orch-worker.yaml")
    run = "\n".join(line[2:] for line in task.split("run: |\n", 1)[1].splitlines())
    pending = tmp_path / "home" / ".orch" / "pending-adopt"
    orch = (
        '#!/bin/sh\necho "orch $*" >> "$CALLS"\n'
        f'if [ "$1" = adopt ]; then mkdir -p {pending}; touch {pending}/Ab_12.json; fi\n'
        'if [ "$1" = status ]; then n=$(grep -c "orch status" "$CALLS"); echo "[]"; '
        f'[ "$n" -ge 3 ] && rm -f {pending}/*.json; fi\n'  # the daemon adopted it at the hand-over
    )
    env = _env(tmp_path, _bin(tmp_path, "orch", text=orch))
    _bin(tmp_path, "sleep", text="#!/bin/sh\nexit 0\n")

    subprocess.run(["bash", "-c", run], env=env, check=True, timeout=30)

    assert [c for c in _calls(tmp_path) if c.startswith("orch status")] == ["orch status --json"] * 3
    assert _calls(tmp_path)[-1] == "orch daemon stop"
