"""The warm pre-flight beside the daemon (issue 36): a real daemon starts `python -m
training.preflight --serve` at the first built-in submit it hears of (not at its own start: a daemon
that runs only command jobs never pays for it), submits of built-in jobs are answered by it (one process, request
after request), and whenever it cannot answer — killed, stale (a module file it loaded changed), a
daemon gone — `orch submit` runs the one-shot pre-flight subprocess and refuses the same job the
same way. No clock: each step waits for the daemon's log or the process."""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest
import tomli_w

from daemon_harness import OrchHome, orch_home, wait_for  # noqa: F401  (fixture)
from orchestrator.home.paths import Home
from orchestrator.jobs import preflight_server
from training.toy import build_tiny_bert, sentiment_rows, write_jsonl

WARM_S = 240.0  # importing torch and transformers on a busy two-core machine
READY = re.compile(r"warm pre-flight (\d+): ready on ")


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("warm-preflight-assets")
    build_tiny_bert(root / "tiny-bert", [r["text"] for r in sentiment_rows(200)], hidden=16, layers=1, vocab_size=200)
    write_jsonl(root / "train.jsonl", sentiment_rows(40, seed=1))
    return root


def _job(folder: Path, assets: Path, monitor: str) -> Path:
    """A built-in job whose early_stopping.monitor only the pre-flight can judge (val_f1: refused
    with two labels; val_acc: fine)."""
    spec = {
        "name": "warm",
        "gpus": 0,
        "model": {"name_or_path": str(assets / "tiny-bert")},
        "data": {"train": str(assets / "train.jsonl"), "num_workers": 0},
        "train": {"max_steps": 2, "batch_size": 8},
        "early_stopping": {"monitor": monitor, "mode": "max"},
    }
    path = folder / f"{monitor}.toml"
    path.write_text(tomli_w.dumps(spec))
    return path


def _server_pid(h: OrchHome, after: int = 0) -> int:
    """The pid of the warm pre-flight that said it is ready, the `after`-th one onwards."""

    def ready() -> int:
        found = READY.findall(h.log_text())
        return int(found[after]) if len(found) > after else 0

    return wait_for(ready, WARM_S, what=lambda: f"the warm pre-flight to be ready; log:\n{h.log_tail(30)}")


def _gone(pid: int) -> bool:
    """Exited: no process, or a zombie its daemon has not reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _answered(h: OrchHome, pid: int) -> int:
    return len(re.findall(rf"warm pre-flight {pid}: request \d+: answered in ", h.log_text()))


def _refused_for_val_f1(h: OrchHome, job: Path) -> None:
    ran = h.cli("submit", str(job), timeout=300)
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert f"{job}: early_stopping.monitor: 'val_f1' is logged only with 3 or more" in ran.stderr, ran.stderr
    assert "Traceback" not in ran.stderr


def _warmed(h: OrchHome, assets: Path, after: int = 0) -> int:
    """A daemon starts no warm pre-flight of its own: the first built-in submit (checked by the
    subprocess) asks for one. Its pid, once ready."""
    assert "warm pre-flight" not in h.log_text()[h.log_text().rfind("daemon started") :]
    _refused_for_val_f1(h, _job(h.jobs_dir, assets, "val_f1"))
    return _server_pid(h, after=after)


def test_a_daemon_keeps_one_warm_preflight_that_submits_reuse_and_a_new_daemon_a_new_one(orch_home, assets):
    h = orch_home(warm_preflight=True)
    daemon = h.start_daemon()
    pid = _warmed(h, assets)
    bad, good = _job(h.jobs_dir, assets, "val_f1"), _job(h.jobs_dir, assets, "val_acc")
    _refused_for_val_f1(h, bad)
    _refused_for_val_f1(h, bad)
    ran = h.cli("submit", str(good), timeout=300)
    assert ran.returncode == 0, ran.stderr
    assert _answered(h, pid) == 3  # the same process answered all three: nothing re-imported
    assert h.store.jobs()[0].name == "warm" and len(h.store.jobs()) == 1

    h.stop_daemon(daemon)
    wait_for(lambda: _gone(pid), 30, what="the warm pre-flight to end with its daemon")
    assert not preflight_server.socket_path(h.home).exists()
    h.start_daemon()
    second = _warmed(h, assets, after=1)
    assert second != pid
    _refused_for_val_f1(h, bad)
    assert _answered(h, second) == 1


def test_a_killed_warm_preflight_leaves_submit_to_the_subprocess(orch_home, assets):
    h = orch_home(warm_preflight=True)
    h.start_daemon()
    pid = _warmed(h, assets)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: _gone(pid), 30, what="the warm pre-flight to die")
    assert preflight_server.socket_path(h.home).exists()  # a socket nobody listens on: refused, not hung
    _refused_for_val_f1(h, _job(h.jobs_dir, assets, "val_f1"))
    assert _answered(h, pid) == 0


def test_a_stale_warm_preflight_is_not_used_and_is_replaced(orch_home, assets, tmp_path, monkeypatch):
    """A module file the server loaded changes (a package upgraded, our code edited): it answers
    nothing from what it imported before, the subprocess checks the job, and the daemon starts a
    fresh server."""
    site = tmp_path / "site"
    site.mkdir()
    module = site / "sitecustomize.py"  # loaded by every Python the daemon starts, the server too
    module.write_text("# a module the warm pre-flight has loaded\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    h = orch_home(warm_preflight=True)
    h.start_daemon()
    pid = _warmed(h, assets)
    home = Home(h.root)
    answer = preflight_server.ask(home, {"checks": []}, sys.executable, 60)
    assert answer is not None and answer["server"] == pid
    assert preflight_server.ask(home, {"checks": []}, "/another/python3", 60) is None  # not the job's interpreter
    later = time.time() + 60
    os.utime(module, (later, later))
    assert preflight_server.ask(home, {"checks": []}, sys.executable, 60) is None
    wait_for(lambda: _gone(pid), 30, what="the stale warm pre-flight to exit")
    assert f"warm pre-flight {pid}: request 3: stale ({module}" in h.log_text()
    _refused_for_val_f1(h, _job(h.jobs_dir, assets, "val_f1"))
    # the daemon starts a new one on the files as they are now, and it answers
    fresh = _server_pid(h, after=1)
    assert fresh != pid
    answer = preflight_server.ask(home, {"checks": []}, sys.executable, 60)
    assert answer is not None and answer["server"] == fresh


def test_without_a_warm_preflight_there_is_no_answer(tmp_path):
    home = Home(tmp_path / "home").ensure()
    assert preflight_server.ask(home, {"checks": []}, sys.executable, 5) is None  # no socket at all


def test_a_daemon_with_warm_preflight_false_starts_none(orch_home, assets):
    h = orch_home(warm_preflight=False)
    h.start_daemon()
    assert "warm pre-flight" not in h.log_text()
    assert not preflight_server.socket_path(h.home).exists()
    _refused_for_val_f1(h, _job(h.jobs_dir, assets, "val_f1"))  # the one-shot subprocess, as before
