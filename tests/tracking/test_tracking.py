"""[tracking] in job.toml, the trackers' variables every attempt gets, and the runner's tracker
threads: a tracker that fails, hangs or points at a dead server never fails or slows the job, and
never shows a secret. The real libraries' runs across a preemption are in test_tracking_e2e.py."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import pytest

from orchestrator.jobs.attempts import job_env
from orchestrator.contract import TRACKING, tracker_env, tracker_run_id
from orchestrator.spec.jobspec import SpecError, spec_from_dict
from training.tracking.notes import TrackingNotes, redact
from training.tracking.trackers import Backend, JobInfo, TrackerLogger, TrackerWorker, open_trackers

COMMAND = {"command": ["python", "train.py"], "gpus": 0}


@pytest.mark.parametrize(
    "table, problem",
    [
        ({"backends": ["wandb", "neptune"]}, "tracking.backends[1]: must be one of 'wandb', 'swanlab' or 'mlflow'"),
        ({"backends": ["mlflow", "mlflow"]}, "'mlflow' is listed twice"),
        ({"backends": []}, "tracking.backends: must not be empty"),
        ({}, "tracking.backends: is required"),
        ({"backends": ["wandb"], "mode": "offlin"}, "tracking.mode: must be one of 'online' or 'offline'"),
        ({"backends": ["wandb"], "mlflow_uri": "http://h:5000"}, '"mlflow" is not in backends'),
        ({"backends": ["wandb"], "project": "a/b"}, "cannot be a tracker project name"),
        ({"backends": ["wandb"], "projekt": "x"}, "unknown key 'tracking.projekt' (did you mean 'tracking.project'?)"),
    ],
)
def test_a_bad_tracking_table_is_refused_with_the_field_named(table, problem):
    with pytest.raises(SpecError) as err:
        spec_from_dict({**COMMAND, "tracking": table}, "job.toml")
    assert problem in str(err.value)


def test_a_password_in_mlflow_uri_is_never_echoed_in_a_problem():
    with pytest.raises(SpecError) as err:
        spec_from_dict(
            {**COMMAND, "tracking": {"backends": ["mlflow"], "mlflow_uri": "http://me:hunter22@h\n"}}, "job.toml"
        )
    assert "mlflow_uri" in str(err.value) and "hunter22" not in str(err.value)


def test_the_table_defaults_and_the_json_schema_has_it():
    from orchestrator.spec.jobspec import JobSpec

    spec = spec_from_dict({**COMMAND, "tracking": {"backends": ["swanlab"]}}, "job.toml")
    assert spec.tracking is not None and spec.tracking.mode == "online" and spec.tracking.project is None
    schema = JobSpec.model_json_schema()
    assert "tracking" in schema["properties"] and "TrackingSection" in schema["$defs"]


def test_every_attempt_gets_the_same_tracker_ids_and_mlflow_s_once_recorded():
    uid = "0f3c9e2a4b5d6e7f8091a2b3c4d5e6f7"
    tracking = {"backends": ["wandb", "swanlab", "mlflow"], "mode": "offline", "mlflow_uri": "file:///m"}
    first = tracker_env(uid, tracking, "sst2", None)
    assert first["ORCH_JOB_UID"] == uid
    assert first["WANDB_RUN_ID"] == first["SWANLAB_RUN_ID"] == tracker_run_id(uid)
    assert first["WANDB_RESUME"] == first["SWANLAB_RESUME"] == "allow"
    assert "MLFLOW_RUN_ID" not in first  # MLflow makes its own ids: none known yet
    assert first["WANDB_PROJECT"] == first["SWANLAB_PROJ_NAME"] == first["MLFLOW_EXPERIMENT_NAME"] == "sst2"
    assert first["WANDB_MODE"] == first["SWANLAB_MODE"] == "offline"
    assert first["MLFLOW_TRACKING_URI"] == "file:///m"
    later = tracker_env(uid, tracking, "sst2", {"backends": {"mlflow": {"run_id": "ab12cd"}}})
    assert later == {**first, "MLFLOW_RUN_ID": "ab12cd"}
    # without a table a script's own wandb.init() still continues one run; a torn record is ignored
    bare = tracker_env(uid, None, "sst2", {"backends": {"mlflow": "junk"}})
    assert set(bare) == {"ORCH_JOB_UID", "WANDB_RUN_ID", "WANDB_RESUME", "SWANLAB_RUN_ID", "SWANLAB_RESUME"}


def test_the_job_s_own_env_overrides_a_tracker_variable_and_the_daemon_s_does_not(tmp_path):
    env = job_env(
        {"WANDB_RUN_ID": "from-the-daemon-shell", "PATH": "/bin"},
        job_id=3,
        attempt=2,
        run_dir=tmp_path,
        gpu_ids=[],
        resume_from=None,
        extra={"WANDB_PROJECT": "mine"},
        trackers=tracker_env("u1", {"backends": ["wandb"], "project": "theirs"}, "j", None),
    )
    assert env["WANDB_RUN_ID"] == "u1" and env["WANDB_PROJECT"] == "mine" and env["ORCH_JOB_UID"] == "u1"


def test_redact_hides_url_credentials_key_values_and_secret_variables():
    env = {"WANDB_API_KEY": "k" * 40}
    text = redact(f"POST https://me:pw123@mlflow.lab/api failed; api_key=abcd1234 header {'k' * 40}", env)
    assert "pw123" not in text and "abcd1234" not in text and "k" * 40 not in text
    assert "https://***@mlflow.lab/api" in text


def test_tracker_messages_are_masked_by_the_one_redaction_rule():
    """What the notifiers, the object store and the mirror mask, a tracker's warning masks too:
    the one rule (orchestrator/redaction.py), kept to one line of 300 characters."""
    from orchestrator.redaction import redact as the_rule

    raw = "401 Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.abc for key AKIAIOSFODNN7EXAMPLE\nsecond line"
    text = redact(raw, {})
    assert "eyJhbGciOiJIUzI1NiJ9" not in text and "AKIAIOSFODNN7EXAMPLE" not in text, text
    assert text == " ".join(the_rule(raw).split())


# -- the tracker threads ------------------------------------------------------------------------


class Recorder(Backend):
    """A stand-in tracker library (a third party's, not orch's code): records what it is handed,
    and can fail or stall where a real one does."""

    name = "wandb"

    def __init__(self, job: JobInfo, *, fail_in: Optional[str] = None, stall_until: Optional[threading.Event] = None):
        super().__init__(job)
        self.fail_in, self.stall_until = fail_in, stall_until
        self.calls: list[tuple[str, Any]] = []

    def _do(self, what: str, *args: Any) -> None:
        if self.stall_until is not None:  # a hung server: nothing returns until the test says so
            self.stall_until.wait()
        if what == self.fail_in:
            raise ConnectionError(f"{what}: 401 for https://u:s3cret@api.example (api_key=XYZSECRET)")
        self.calls.append((what, args))

    def open(self) -> dict[str, Any]:
        self._do("open")
        return {"run_id": self.job.run_id}

    def metrics(self, metrics: dict[str, float], step: Optional[int]) -> None:
        self._do("metrics", step, "val" if any(k.startswith("val_") for k in metrics) else "train")

    def close(self, outcome: str) -> None:
        self._do("close", outcome)


def tracking(**kw: Any) -> SimpleNamespace:
    return SimpleNamespace(**{"backends": ["wandb"], "project": None, "mode": "offline", "mlflow_uri": None, **kw})


def start(tmp_path: Path, monkeypatch, resume_step: Optional[int] = None, **backend_kw: Any):
    monkeypatch.setenv("ORCH_JOB_UID", "uid7")
    made: list[Recorder] = []

    def make(name: str, job: JobInfo) -> Recorder:
        made.append(Recorder(job, **backend_kw))
        return made[-1]

    trackers = open_trackers(tracking(), tmp_path, "job", resume_step=resume_step, make=make)
    assert trackers is not None
    return trackers, made[0]


def test_a_tracker_that_fails_stops_with_one_warning_and_no_secret(tmp_path, monkeypatch, capfd):
    trackers, backend = start(tmp_path, monkeypatch, fail_in="metrics")
    logger = trackers.loggers[0]
    for step in range(20):
        logger.log_metrics({"train_loss": 1.0}, step)
    trackers.close("finished")
    err = capfd.readouterr().err
    assert err.count("tracker wandb is not logging") == 1, err
    note = json.loads((tmp_path / TRACKING).read_text())["backends"]["wandb"]
    assert "metrics failed: ConnectionError" in note["warning"]
    for secret in ("s3cret", "XYZSECRET"):
        assert secret not in err and secret not in note["warning"]
    assert [c[0] for c in backend.calls] == ["open"]  # nothing after the failure, not even close


def test_a_stalled_tracker_never_slows_the_step_and_the_close_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr("training.tracking.trackers.CLOSE_WAIT_S", {"finished": 0.5, "failed": 0.5, "paused": 0.5})
    hung = threading.Event()
    trackers, backend = start(tmp_path, monkeypatch, stall_until=hung)
    logger = trackers.loggers[0]
    try:
        # The tracker answers nothing until `hung` is set, so a step that waited on it would
        # never finish: 2000 steps that finish while it hangs never waited.
        steps = threading.Thread(target=lambda: [logger.log_metrics({"train_loss": 1.0}, s) for s in range(2000)])
        steps.start()
        steps.join(60)
        assert not steps.is_alive(), "a step waited on a hung tracker"
        closer = threading.Thread(target=trackers.close, args=("finished",))
        closer.start()
        closer.join(60)
        assert not closer.is_alive(), "close waited on a hung tracker past CLOSE_WAIT_S"
        assert backend.calls == []  # it really was hung all along
    finally:
        hung.set()
    note = json.loads((tmp_path / TRACKING).read_text())["backends"]["wandb"]
    assert "did not finish within" in note["warning"]


def test_rows_an_earlier_attempt_sent_are_not_sent_again_after_a_sigkill(tmp_path, monkeypatch):
    TrackingNotes(tmp_path, "uid7").update("wandb", run_id="uid7", last_step=29)
    trackers, backend = start(tmp_path, monkeypatch, resume_step=20)  # resumed from an older checkpoint
    for step in (20, 25, 29, 30, 31):
        trackers.loggers[0].log_metrics({"train_loss": 1.0}, step)
    trackers.close("finished")
    assert [c[1][0] for c in backend.calls if c[0] == "metrics"] == [30, 31]
    assert json.loads((tmp_path / TRACKING).read_text())["backends"]["wandb"]["last_step"] == 31


class HungServer:
    """A real listening socket that takes connections and answers nothing until released, then
    hangs up on every one and refuses new ones: a server that dies after seeming alive."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._take, daemon=True).start()

    def _take(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # released
                return
            self.held.append(conn)

    def release(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)  # wakes accept(): the port refuses from now on
        self.sock.close()
        for conn in self.held:
            conn.close()


def test_the_end_of_the_run_reaches_a_slow_tracker_whose_queue_is_full(tmp_path, monkeypatch):
    """close() used to be put on the full queue without waiting, and dropped: the W&B run was never
    finished. Now the rows queued are sent and the run is closed with the attempt's outcome."""
    monkeypatch.setattr("training.tracking.trackers.QUEUE_ROWS", 10)
    monkeypatch.setattr(
        "training.tracking.trackers.CLOSE_WAIT_S", {"finished": 120.0, "failed": 120.0, "paused": 120.0}
    )
    slow = threading.Event()
    trackers, backend = start(tmp_path, monkeypatch, stall_until=slow)
    worker: TrackerWorker = trackers.workers[0]
    for step in range(50):  # the queue holds 10: the rest are dropped, as a slow tracker's rows are
        trackers.loggers[0].log_metrics({"train_loss": 1.0}, step)
    closer = threading.Thread(target=trackers.close, args=("finished",))
    closer.start()
    for _ in range(100):  # until close() has asked (the old close() never sets this: then go on)
        if getattr(worker, "closing", None) is not None:
            break
        time.sleep(0.05)
    slow.set()  # the tracker answers again
    closer.join(120)
    assert not closer.is_alive()
    assert backend.calls[-1] == ("close", ("finished",)), backend.calls[-3:]
    assert [c[1][0] for c in backend.calls if c[0] == "metrics"] == list(range(10))


def test_a_resumed_attempt_sends_the_validation_due_at_the_notice_step(tmp_path, monkeypatch):
    """The notice came at step 30: its train row was sent, its validation runs after the resume
    (metrics.csv keeps it) and must reach the tracker too; a validation row already sent is not
    sent again."""
    TrackingNotes(tmp_path, "uid7").update("wandb", run_id="uid7", last_step=30, last_validation_step=20)
    trackers, backend = start(tmp_path, monkeypatch, resume_step=30)
    logger = trackers.loggers[0]
    logger.log_metrics({"val_loss": 0.5}, 20)  # (a redo: sent by the earlier attempt)
    logger.log_metrics({"train_loss": 1.0}, 30)
    logger.log_metrics({"val_loss": 0.4}, 30)
    logger.log_metrics({"train_loss": 0.9}, 31)
    trackers.close("finished")
    sent = [(c[1][0], c[1][1]) for c in backend.calls if c[0] == "metrics"]
    assert sent == [(30, "val"), (31, "train")]
    note = json.loads((tmp_path / TRACKING).read_text())["backends"]["wandb"]
    assert (note["last_step"], note["last_validation_step"]) == (31, 30)


def test_a_users_wandb_dir_is_where_the_offline_run_lands(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    mine = tmp_path / "my-wandb"
    monkeypatch.setenv("ORCH_JOB_UID", "uid9")
    monkeypatch.setenv("WANDB_DIR", str(mine))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_MODE", "offline")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    trackers = open_trackers(tracking(mode="offline"), run_dir, "job", resume_step=None)
    assert trackers is not None
    trackers.loggers[0].log_metrics({"train_loss": 1.0}, 1)
    trackers.close("finished")
    note = json.loads((run_dir / TRACKING).read_text())["backends"]["wandb"]
    assert "warning" not in note or not note["warning"], note
    assert list((mine / "wandb").glob("offline-run-*")), list(mine.rglob("*"))[:10]
    assert not (run_dir / "trackers" / "wandb").exists()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_mlflow_at_a_dead_server_costs_the_job_nothing_but_a_warning(tmp_path, monkeypatch, capfd):
    pytest.importorskip("mlflow")
    monkeypatch.setenv("ORCH_JOB_UID", "uid8")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # the runner's default, 2, only waits longer
    server = HungServer()
    uri = f"http://me:pw-secret-9@127.0.0.1:{server.port}"
    trackers = open_trackers(tracking(backends=["mlflow"], mlflow_uri=uri), tmp_path, "job", resume_step=None)
    assert trackers is not None
    logger: TrackerLogger = trackers.loggers[0]  # type: ignore[assignment]
    try:
        # The server answers nothing until released: 500 steps that finish meanwhile never waited on it.
        steps = threading.Thread(target=lambda: [logger.log_metrics({"train_loss": 0.5}, s) for s in range(500)])
        steps.start()
        steps.join(60)
        assert not steps.is_alive(), "a step waited on the tracker's server"
    finally:
        server.release()
    trackers.close("finished")
    note = json.loads((tmp_path / TRACKING).read_text())["backends"]["mlflow"]
    assert note["warning"].startswith("could not start"), note
    err = capfd.readouterr().err
    assert "pw-secret-9" not in err and "pw-secret-9" not in (tmp_path / TRACKING).read_text()
    assert err.count("tracker mlflow is not logging") == 1


def test_a_job_without_a_tracking_table_opens_nothing(tmp_path):
    assert open_trackers(None, tmp_path, "job", resume_step=None) is None
    assert not (tmp_path / TRACKING).exists()


def test_tracker_worker_records_where_it_is(tmp_path, monkeypatch):
    trackers, _ = start(tmp_path, monkeypatch)
    worker: TrackerWorker = trackers.workers[0]
    assert worker.ready.wait(5)
    trackers.close("paused")
    assert json.loads((tmp_path / TRACKING).read_text())["backends"]["wandb"]["run_id"] == "uid7"
