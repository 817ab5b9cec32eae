"""Notifications end to end: a real `orch daemon run` process, real jobs, and real servers on
127.0.0.1 (aiosmtpd, a WeCom-format robot, a generic webhook). A provider outage delays messages
but never loses, duplicates or reorders them, and never delays dispatch; a permanent error shows
in `orch show`; secrets given as `*_env` never leave the process."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest
from daemon_harness import OrchHome, orch_home, wait_for  # noqa: F401  (fixture)

from notify_servers import PASSWORD, USER, Inbox, ProviderServer, authenticator, free_port

from orchestrator.jobs.notify import load_config_checked
from orchestrator.model.states import JobState

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "examples" / "quickstart"
WECOM_KEY = "93a1c0de-5b7e-4c11-9f00-e2e5ec7e7k3y"
HOOK_TOKEN = "hooktok-6f1d2a9b8c7e"
WECOM_OK = {"errcode": 0, "errmsg": "ok"}
WECOM_BAD_KEY = {
    "errcode": 93000,
    "errmsg": "invalid webhook url, hint: [1712345678_abc], from ip: 10.0.0.1, "
    "more info at https://open.work.weixin.qq.com/devtool/query?e=93000",
}


# ---- helpers ------------------------------------------------------------------------------


class FixedPort:
    """A loopback port the config points at: closed (connection refused) until `up(provider)`
    serves it with that ProviderServer's behaviour and request log; `down()` closes it again."""

    def __init__(self) -> None:
        self.port = free_port()
        self.httpd: ThreadingHTTPServer | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def up(self, provider: ProviderServer) -> None:
        assert self.httpd is None
        httpd = ThreadingHTTPServer(("127.0.0.1", self.port), provider.httpd.RequestHandlerClass)
        httpd.daemon_threads = True
        threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True).start()
        self.httpd = httpd

    def down(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None


@pytest.fixture
def servers() -> Iterator[Any]:
    made: list[Any] = []

    def make(kind: type = ProviderServer) -> Any:
        made.append(kind())
        return made[-1]

    yield make
    for s in made:
        (s.down if isinstance(s, FixedPort) else s.close)()


@pytest.fixture
def smtp() -> Iterator[tuple[int, Inbox]]:
    """A real aiosmtpd server on loopback with AUTH (plaintext AUTH only because it is loopback)."""
    from aiosmtpd.controller import Controller

    inbox = Inbox()
    controller = Controller(
        inbox,
        hostname="127.0.0.1",
        port=free_port(),
        authenticator=authenticator,
        auth_required=True,
        auth_require_tls=False,
    )
    controller.start()
    try:
        yield controller.port, inbox
    finally:
        controller.stop()


def configure(h: OrchHome, notify: str, **daemon: Any) -> None:
    """The harness's [daemon] section plus fast retries and the given [[notifiers]] tables."""
    h.configure(**daemon)
    path = h.root / "config.toml"
    fast = "[notify]\nretry_base_seconds = 0.5\nretry_max_seconds = 2.0\n"
    path.write_text(path.read_text() + fast + notify)
    h.config = load_config_checked(path, required=True)


def sent(provider: ProviderServer) -> list[tuple[int, str]]:
    """(job id, event) of each message the generic webhook server accepted, in arrival order."""
    return [(r.json()["message"]["job_id"], r.json()["event"]) for r in provider.requests]


def everything_said(h: OrchHome, job_ids: list[int], *cli_args: tuple[str, ...]) -> str:
    """All the text orch shows a user or writes down: show (text and JSON) per job, the given
    extra commands' output, daemon.log and every event's detail."""
    parts = [h.home.log_file.read_text(errors="replace")]
    for job_id in job_ids:
        for args in (("show", str(job_id)), ("show", str(job_id), "--json")):
            r = h.cli(*args)
            assert r.returncode == 0, r.stderr
            parts += [r.stdout, r.stderr]
    for args in cli_args:
        r = h.cli(*args)
        parts += [r.stdout, r.stderr]
    parts += [e.detail for e in h.store.events()]
    parts += [row.last_error for row in h.store.outbox()]
    return "\n".join(parts)


# ---- an outage -------------------------------------------------------------------------


@pytest.mark.slow
def test_an_outage_delays_messages_but_loses_duplicates_and_reorders_none_and_never_blocks_dispatch(
    orch_home, servers, monkeypatch
):
    port = servers(FixedPort)
    healthy, failing, broken = servers(), servers(), servers()
    held = threading.Event()
    failing.reply(500, "<html>502 Bad Gateway</html>", hold=held)  # failing, and as slow as the test wants
    broken.reply(200, WECOM_BAD_KEY)  # a deleted robot: permanent
    # The token as a path segment, where only the exact-value scrubbing can hide it.
    monkeypatch.setenv("ORCH_TEST_HOOK_URL", f"{port.base_url}/services/{HOOK_TOKEN}")
    monkeypatch.setenv("ORCH_TEST_WECOM_URL", f"{broken.base_url}/cgi-bin/webhook/send?key={WECOM_KEY}")
    h = orch_home()
    configure(
        h,
        """
[[notifiers]]
type = "webhook"
name = "hook"
url_env = "ORCH_TEST_HOOK_URL"
events = ["started", "succeeded", "failed"]

[[notifiers]]
type = "wecom"
name = "deleted-robot"
url_env = "ORCH_TEST_WECOM_URL"
events = ["failed"]
""",
        cpu_slots=2,
    )
    h.start_daemon()

    # Phase 1, the port is closed: three jobs run and finish.
    jobs = [h.submit("first"), h.submit("second", exit=3), h.submit("third")]
    for job_id in jobs:
        h.wait_state(job_id, JobState.SUCCEEDED, JobState.FAILED)
    wait_for(
        lambda: any("connection" in r.last_error for r in h.store.outbox() if r.channel == "hook"),
        10,
        what="a refused delivery to be recorded",
    )

    # Phase 2, the server holds a delivery open (its 500 comes when the test says): a job
    # submitted meanwhile starts while that delivery is still waiting for its answer.
    port.up(failing)
    try:
        wait_for(lambda: failing.open >= 1, 30, what="a delivery held open by the server")
        late = h.submit("late")
        h.wait_record("late", "start", timeout=60)
        assert failing.open >= 1, "the delivery ended before the job started"  # it can end only on `held`
    finally:
        held.set()
    wait_for(lambda: len(failing.requests) >= 2, 30, what="two failed tries against the 500 server")
    h.wait_state(late, JobState.SUCCEEDED)
    jobs.append(late)
    assert all(r.delivered_at is None for r in h.store.outbox() if r.channel == "hook")

    # Phase 3, the provider is back: every message arrives exactly once, in order.
    port.down()
    port.up(healthy)
    wait_for(
        lambda: h.store.pending_outbox() == 0,
        20,
        what=f"the outbox to drain (received {sent(healthy)}; log: {h.log_tail()})",
    )
    h.wait_ticks(0, outbox=2)  # a further pass or two must send nothing again
    received = sent(healthy)
    expected = [(j, "started") for j in jobs] + [(j, h.state(j).value) for j in jobs]
    assert sorted(received) == sorted(expected), received
    assert len(set(received)) == len(received), f"duplicates: {received}"
    for j in jobs:
        assert [e for i, e in received if i == j][0] == "started", f"job {j} out of order: {received}"
    hook_rows = [r for r in h.store.outbox() if r.channel == "hook"]
    assert received == [(r.job_id, r.payload["event"]) for r in hook_rows], "not in the order the events happened"
    assert all(r.delivered_at is not None for r in hook_rows)
    assert h.state(jobs[1]) is JobState.FAILED and h.state(jobs[0]) is JobState.SUCCEEDED

    # The deleted robot gave up at once, and the failed job's history says so.
    (gave_up,) = [r for r in h.store.outbox() if r.channel == "deleted-robot"]
    assert gave_up.gave_up_at is not None and gave_up.tries == 1 and len(broken.requests) == 1
    show = h.cli("show", str(jobs[1]))
    assert show.returncode == 0, show.stderr
    assert "notify_failed" in show.stdout and "deleted-robot" in show.stdout and "93000" in show.stdout, show.stdout

    # Neither secret ever left the daemon, though its URLs were in every failed try.
    said = everything_said(h, [jobs[1]])
    assert HOOK_TOKEN not in said and WECOM_KEY not in said


# ---- the whole path ----------------------------------------------------------------------


def quickstart_job(tmp: Path) -> Path:
    """The quickstart built-in job made smaller (one epoch on 320 rows): same model, same code path."""
    if not (QUICKSTART / "tiny-bert" / "config.json").is_file() or not (QUICKSTART / "data" / "dev.jsonl").is_file():
        subprocess.run([sys.executable, str(QUICKSTART / "prepare.py")], check=True, timeout=120)
    folder = tmp / "quickstart"
    folder.mkdir()
    for name, rows in (("train", 320), ("dev", 64)):
        lines = (QUICKSTART / "data" / f"{name}.jsonl").read_text().splitlines()[:rows]
        (folder / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
    job = folder / "job.toml"
    job.write_text(f"""name = "quickstart"
gpus = 0
retries = 0

[model]
name_or_path = {json.dumps(str(QUICKSTART / "tiny-bert"))}
num_labels = 2

[data]
train = "train.jsonl"
validation = "dev.jsonl"
text_field = "text"
label_field = "label"
max_length = 32
num_workers = 0

[train]
max_epochs = 1
batch_size = 32
precision = "32"
learning_rate = 1e-3
seed = 42

[early_stopping]
monitor = "val_acc"
mode = "max"
patience = 2

[env]
HF_HUB_OFFLINE = "1"
TRANSFORMERS_OFFLINE = "1"
""")
    return job


@pytest.mark.slow
def test_a_builtin_success_and_a_command_failure_reach_email_and_wecom_with_what_a_user_needs(
    orch_home, servers, smtp, monkeypatch, tmp_path
):
    from orchestrator.host.gpus import managed_gpus
    from orchestrator.jobs.lifecycle import submit_job
    from orchestrator.home.wake import poke

    smtp_port, inbox = smtp
    robot = servers()
    robot.reply(200, WECOM_OK)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("ORCH_TEST_SMTP_PASSWORD", PASSWORD)
    monkeypatch.setenv("ORCH_TEST_WECOM_URL", f"{robot.base_url}/cgi-bin/webhook/send?key={WECOM_KEY}")
    h = orch_home()
    configure(
        h,
        f"""
[pricing]
currency = "CNY"

[[notifiers]]
type = "email"
name = "mail"
host = "127.0.0.1"
port = {smtp_port}
username = "{USER}"
password_env = "ORCH_TEST_SMTP_PASSWORD"
to = ["{USER}", "oncall@example.com"]
events = ["succeeded", "failed"]

[[notifiers]]
type = "wecom"
name = "robot"
url_env = "ORCH_TEST_WECOM_URL"
""",
        cpu_slots=2,
    )
    h.start_daemon()

    builtin = submit_job(
        h.store,
        h.config,
        h.home,
        quickstart_job(tmp_path),
        now=time.time(),
        machine_gpus=len(managed_gpus(h.config.daemon.gpus)),
    ).id
    poke(h.home.wake_socket)
    broken = h.submit("broken", print=["loading shards", "CUDA error: device-side assert triggered"], exit=3)
    h.wait_state(broken, JobState.FAILED)
    h.wait_state(builtin, JobState.SUCCEEDED, JobState.FAILED, timeout=60)
    assert h.state(builtin) is JobState.SUCCEEDED, h.cli("logs", str(builtin)).stdout[-3000:]
    result = json.loads((h.run_dir(builtin) / "result.json").read_text())
    best = f"val_acc={result['best_metric']:.4g}"

    # WeCom: a markdown message per job, and after the built-in job's its loss curve as an image
    # message (the command job wrote no metrics.csv: no picture).
    wait_for(
        lambda: len(inbox.envelopes) >= 2 and len(robot.requests) >= 3,
        20,
        what=f"two mails and three robot messages (log: {h.log_tail()})",
    )
    h.wait_ticks(0, outbox=3)  # three more deliveries: no more than that
    assert len(inbox.envelopes) == 2 and len(robot.requests) == 3
    images = [r.json()["image"] for r in robot.requests if r.json()["msgtype"] == "image"]
    assert len(images) == 1
    png = base64.b64decode(images[0]["base64"])
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and hashlib.md5(png).hexdigest() == images[0]["md5"]

    mails = {mail["Subject"]: (sender, rcpts, mail) for sender, rcpts, mail in inbox.envelopes}
    ok_subject, bad_subject = f"[orch] job {builtin} quickstart succeeded", f"[orch] job {broken} broken failed"
    assert set(mails) == {ok_subject, bad_subject}
    for sender, rcpts, mail in mails.values():
        assert sender == USER and rcpts == [USER, "oncall@example.com"]
        assert mail["To"] == f"{USER}, oncall@example.com"
    ok_text = mails[ok_subject][2].get_body(("plain",)).get_content()
    bad_text = mails[bad_subject][2].get_body(("plain",)).get_content()
    assert f"Job: {builtin} (quickstart)" in ok_text and "State: succeeded" in ok_text
    assert f"Best metric: {best}" in ok_text and "Checkpoint: " in ok_text and "Cost: " in ok_text
    assert f"Job: {broken} (broken)" in bad_text and "State: failed" in bad_text
    assert "Reason: exit code 3" in bad_text and f"orch logs {broken}" in bad_text
    assert "Last log lines:" in bad_text and "CUDA error: device-side assert triggered" in bad_text
    assert "Last log lines:" not in ok_text

    markdown = [r for r in robot.requests if r.json()["msgtype"] == "markdown"]
    assert len(markdown) == 2
    for r in robot.requests:
        assert r.path == "/cgi-bin/webhook/send" and r.query["key"] == [WECOM_KEY]
    contents = {r.json()["markdown"]["content"].splitlines()[0]: r.json()["markdown"]["content"] for r in markdown}
    ok_md, bad_md = contents[f"**{ok_subject}**"], contents[f"**{bad_subject}**"]
    assert "**State:** succeeded" in ok_md and f"**Best metric:** {best}" in ok_md
    assert "**State:** failed" in bad_md and "**Reason:** exit code 3" in bad_md
    assert "> CUDA error: device-side assert triggered" in bad_md and "> loading shards" in bad_md

    said = everything_said(h, [builtin, broken], ("config", "check"))
    assert PASSWORD not in said and WECOM_KEY not in said


# ---- order across passes (what the outage test caught, pinned without timing) --------------


def test_a_row_still_backing_off_holds_back_the_later_rows_of_its_channel(tmp_path, servers):
    from notifiers import Message, build_notifiers
    from orchestrator.jobs.outbox import OutboxSender
    from orchestrator.model.records import Outgoing
    from orchestrator.store import Store

    provider = servers()
    provider.then(503, "busy")  # the first try fails; every later one is accepted
    store = Store(tmp_path / "orch.db")
    try:
        job = store.submit(name="sst2", kind="command", gpus=0, priority=0, retries=0, spec={}, spec_path="", now=0.0)
        hook = build_notifiers([{"type": "webhook", "name": "hook", "url": f"{provider.base_url}/hook"}], env={})[0]
        sender = OutboxSender(store, {"hook": hook}, base_backoff_s=10, max_backoff_s=10)

        def record(event: str, now: float) -> None:
            message = Message(event, job_id=job.id, job_name="sst2").to_dict()
            store.record_event(job.id, event, now, outgoing=[Outgoing("hook", message)])

        record("started", 0.0)
        assert sender.deliver_due(0.0) == 0  # 503: "started" backs off until 10.0
        record("succeeded", 1.0)
        assert sender.deliver_due(2.0) == 0, "'succeeded' went out before 'started'"
        assert sender.deliver_due(10.0) == 2
        assert sent(provider)[1:] == [(job.id, "started"), (job.id, "succeeded")]
    finally:
        store.close()
