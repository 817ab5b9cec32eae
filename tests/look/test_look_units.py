"""Fast checks of issue 14's parts, without training: the TensorBoard events as TensorBoard's own
reader sees them (and the resume cut), the PNG writer, the daemon's health.json reading, the
dashboard's read-only store, and that the daemon never loads the event writer."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tb_reader as tb
from training.logs.tensorboard_log import TensorBoardEvents


def test_events_read_back_by_tensorboard_and_a_resumed_attempt_cuts_from_its_step(tmp_path):
    first = TensorBoardEvents(tmp_path, purge_step=0, attempt="1")
    first.log_metrics({"loss": 1.0, "lr": 0.1, "epoch": 0}, step=10)
    first.log_metrics({"loss": 0.5}, step=20)
    first.log_metrics({"loss": 0.25, "bad": "x"}, step=30)  # steps 20+ are redone by attempt 2
    first.finalize("failed")
    time.sleep(1.01)  # the file name carries the second it was made in
    second = TensorBoardEvents(tmp_path, purge_step=20, attempt="2")
    second.log_metrics({"loss": 0.4}, step=20)
    second.log_metrics({"loss": float("nan")}, step=40)
    second.finalize("success")
    assert [p.name.rsplit(".", 1)[-1] for p in tb.event_files(tmp_path)] == ["attempt-1", "attempt-2"]
    series = tb.read_scalars(tmp_path)
    assert set(series) == {"loss", "lr"}  # not the step/epoch columns, not a value that is no number
    assert [s for s, _ in series["loss"]] == [10, 20, 40]
    assert series["loss"][1][1] == pytest.approx(0.4) and series["lr"] == [(10, pytest.approx(0.1))]
    assert tb.same_value(series["loss"][2][1], float("nan"))


def test_flush_puts_every_logged_event_in_the_file_before_it_returns(tmp_path):
    writer = TensorBoardEvents(tmp_path, purge_step=0, attempt="1", flush_every_s=600)
    for step in range(0, 200, 10):
        writer.log_metrics({"loss": step / 10}, step=step)
    writer.flush()  # what a checkpoint does before its file is written: the writer stays open
    assert [s for s, _ in tb.read_scalars(tmp_path)["loss"]] == list(range(0, 200, 10))
    writer.log_metrics({"loss": 99.0}, step=200)
    writer.finalize("success")
    assert len(tb.event_files(tmp_path)) == 1 and tb.read_scalars(tmp_path)["loss"][-1] == (200, 99.0)


def test_the_loss_curve_png_decodes_and_is_none_without_a_loss(tmp_path):
    import zlib

    from notifiers.curve import draw_curves
    from orchestrator.reports.metrics import read_metrics

    csv = tmp_path / "metrics.csv"
    csv.write_text("epoch,step,train_loss,val_loss\n0,9,0.9,\n0,9,,0.8\n0,19,0.5,\n0,19,,nan\n")
    png = draw_curves(read_metrics(csv)["series"])
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    idat = png.index(b"IDAT")
    length = int.from_bytes(png[idat - 4 : idat], "big")
    assert len(zlib.decompress(png[idat + 4 : idat + 4 + length])) == 240 * (1 + 480 * 3)
    assert draw_curves(read_metrics(tmp_path / "missing.csv")["series"]) is None
    assert draw_curves({"val_acc": [[1, 0.5]]}) is None


def test_the_daemon_records_a_flat_loss_once_and_a_divergence_fails_without_retry(tmp_path):
    from orchestrator.spec.config import Config
    from orchestrator.contract import HEALTH, write_json_atomic
    from orchestrator.daemon.health_watch import LossFlatWatch
    from orchestrator.jobs.outcome import Exit, Retries, decide
    from orchestrator.model.states import Intent
    from orchestrator.reports.health import divergence
    from orchestrator.reports.run_report import RunReport
    from orchestrator.jobs.lifecycle import change_state
    from orchestrator.home.paths import Home
    from orchestrator.model.records import AttemptStart
    from orchestrator.model.states import EventKind, JobState
    from orchestrator.store import Store

    home = Home(tmp_path / "home").ensure()
    store = Store(home.db)
    job = store.submit(name="j", kind="builtin", gpus=0, priority=0, retries=3, spec={}, spec_path="", now=1.0)
    job = change_state(
        store,
        Config(),
        home,
        job,
        JobState.RUNNING,
        EventKind.STARTED,
        2.0,
        expect=[JobState.QUEUED],
        updates={"attempt": 1},
        begin_attempt=AttemptStart(1),
    )
    run_dir = home.run_dir(job.id)
    run_dir.mkdir(parents=True, exist_ok=True)

    class Daemon:  # what the watch needs of the daemon: its store, config and home
        pass

    d = Daemon()
    d.store, d.config, d.home = store, Config(), home
    watch = LossFlatWatch()
    assert watch.check(d, 3.0) == []
    flat = {"step": 100, "baseline": 0.7, "recent": 0.69, "improvement": 0.014, "min_improvement": 0.02, "window": 10}
    write_json_atomic(run_dir / HEALTH, {"loss_flat": flat})
    assert [j.id for j in watch.check(d, 4.0)] == [job.id]
    write_json_atomic(run_dir / HEALTH, {"loss_flat": flat, "flat_checked_at": 100})  # rewritten: still once
    assert watch.check(d, 5.0) == []
    assert len(store.events(job.id, kinds=["loss_flat"])) == 1
    assert divergence(run_dir, job.attempt) is None
    write_json_atomic(
        run_dir / HEALTH,
        {
            "diverged": {
                "step": 37,
                "what": "the training loss became nan",
                "attempt": "1",
                "checkpoint": "step-00000030.ckpt",
            }
        },
    )
    info = divergence(run_dir, store.get(job.id).attempt)
    decided = decide(Intent.NONE, Exit(1), RunReport(diverged=info), is_command=False, retries=Retries(0, 3))
    assert decided.state is JobState.FAILED and decided.charged
    assert "at step 37" in decided.reason and "step-00000030.ckpt" in decided.reason
    write_json_atomic(run_dir / HEALTH, {"diverged": {"step": 37, "what": "nan", "attempt": "0"}})
    assert divergence(run_dir, store.get(job.id).attempt) is None  # an older attempt's record
    # Each daemon has its own watch, and a job that stops running is forgotten (no global, no growth).
    assert job.id in watch.seen and LossFlatWatch().seen == {}
    change_state(
        store, Config(), home, store.get(job.id), JobState.FAILED, EventKind.FAILED, 6.0, expect=[JobState.RUNNING]
    )
    assert watch.check(d, 7.0) == [] and watch.seen == {}
    store.close()


def test_the_dashboard_store_is_read_only(tmp_path):
    from orchestrator.model.errors import OrchError
    from orchestrator.home.paths import Home
    from orchestrator.store import Store

    home = Home(tmp_path / "home").ensure()
    with pytest.raises(OrchError, match="no orch state"):
        Store(home.db, read_only=True).jobs()
    assert not home.db.exists()  # looking created nothing
    Store(home.db).close()
    ro = Store(home.db, read_only=True)
    assert ro.jobs() == []
    with pytest.raises(OrchError, match="read-only"):
        ro.submit(name="x", kind="command", gpus=0, priority=0, retries=0, spec={}, spec_path="", now=1.0)
    import sqlite3

    with pytest.raises(sqlite3.OperationalError):
        ro.db.execute("CREATE TABLE t(x)")


def test_the_daemon_and_the_dashboard_never_import_the_event_writer_or_torch():
    code = (
        "import sys; import orchestrator.daemon.tick, orchestrator.jobs.outbox, orchestrator.dashboard.server;"
        "import notifiers.email, notifiers.wechat, notifiers.curve;"
        "bad = [m for m in ('tensorboardX', 'training.logs.run_logs', 'torch', 'pytorch_lightning') if m in sys.modules];"
        "print(bad)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2]
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.replace("'", '"')) == []


def test_the_wecom_robot_gets_the_curve_as_an_image_message_after_the_text(tmp_path):
    import base64
    import hashlib
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from notifiers import Message, build_notifiers

    bodies: list[dict] = []

    class Robot(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            answer = json.dumps({"errcode": 0, "errmsg": "ok"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Robot)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = (
            f"http://127.0.0.1:{server.server_address[1]}/cgi-bin/webhook/send?key=693a91f6-7xxx-4bc4-97a0-0ec2sifa5aaa"
        )
        (robot,) = build_notifiers([{"type": "wecom", "url": url}], label="test", env={})
        series = {"train_loss": [[9, 0.9], [19, 0.5]]}
        robot.send(Message(event="succeeded", job_id=3, job_name="x", state="succeeded", curve_series=series))
        robot.send(Message(event="preempted", job_id=3, job_name="x", state="queued"))  # no curve: text only
    finally:
        server.shutdown()
    assert [b["msgtype"] for b in bodies] == ["markdown", "image", "markdown"]
    png = base64.b64decode(bodies[1]["image"]["base64"])
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and bodies[1]["image"]["md5"] == hashlib.md5(png).hexdigest()
