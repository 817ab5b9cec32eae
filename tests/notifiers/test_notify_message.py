"""Message rendering and storage, UTF-8 truncation and redaction: the pure parts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from notifiers import EVENT_KINDS, Message, NotifyError
from orchestrator.redaction import redact
from notifiers.base import truncate_utf8
from orchestrator.model.states import EventKind

FULL = Message(
    event="failed",
    job_id=7,
    job_name="sst2-bert",
    state="failed",
    reason="exit code 1 (see attempt-2.log)",
    attempt=2,
    duration_s=3725.4,
    cost=12.3456,
    currency="CNY",
    best_metric="val_acc=0.931",
    checkpoint="/root/autodl-tmp/orch/runs/7/checkpoints/step-00000500.ckpt",
    host="autodl-container-1",
    log_tail="\n".join(f"line {i}" for i in range(100)) + "\nRuntimeError: CUDA error <&>",
    steps_lost=120,
)


def test_message_survives_the_outbox_as_json() -> None:
    stored = json.loads(json.dumps(FULL.to_dict()))
    assert Message.from_dict(stored) == FULL


def test_from_dict_ignores_keys_it_does_not_know() -> None:
    assert Message.from_dict({"event": "started", "job_id": 1, "gpu_model": "A100"}) == Message("started", 1)


def test_title_names_job_and_outcome() -> None:
    assert FULL.title() == "[orch] job 7 sst2-bert failed"
    assert Message("preempted", 3, "bert").title() == "[orch] job 3 bert was preempted"
    assert Message("queue_drained", host="lab").title() == "[orch] orch on lab has nothing left to run"
    assert Message("test", host="lab").title() == "[orch] orch on lab says hello: notifications work"


@pytest.mark.parametrize("kind", EVENT_KINDS)
def test_every_event_kind_renders_in_every_format(kind: str) -> None:
    message = Message(kind, job_id=1, job_name="j")
    assert message.title().startswith("[orch] job 1 j ")
    assert message.text() and message.markdown() and message.html()


def test_text_shows_what_happened_and_what_to_do_next() -> None:
    text = FULL.text()
    for expected in (
        "Attempt: 2",
        "Duration: 1h 02m",
        "Cost: 12.35 CNY",
        "Best metric: val_acc=0.931",
        "Steps lost: 120",
        "Host: autodl-container-1",
        "`orch retry 7`",
        "RuntimeError: CUDA error",
    ):
        assert expected in text
    assert "line 69" not in text and "line 71" in text  # only the last 30 log lines


def test_empty_fields_are_left_out() -> None:
    text = Message("succeeded", 1, "j").text()
    assert "Cost" not in text and "Attempt" not in text and "Last log lines" not in text


def test_html_escapes_everything() -> None:
    html = FULL.html()
    assert "CUDA error &lt;&amp;&gt;" in html and "<&>" not in html


def test_markdown_without_code_blocks_quotes_the_log() -> None:
    assert "```" in FULL.markdown() and "```" not in FULL.markdown(code_blocks=False)
    assert "> RuntimeError: CUDA error <&>" in FULL.markdown(code_blocks=False)


@pytest.mark.parametrize("text, limit", [("a" * 10, 20), ("训练" * 1000, 4096), ("é" * 5000, 2048), ("😀" * 10, 9)])
def test_truncate_utf8_never_exceeds_the_byte_limit_nor_splits_a_character(text: str, limit: int) -> None:
    cut = truncate_utf8(text, limit)
    assert len(cut.encode("utf-8")) <= limit
    if len(text.encode("utf-8")) <= limit:
        assert cut == text
    else:
        kept = cut.removesuffix("\n…(truncated)")
        assert kept and text.startswith(kept)
        assert cut.endswith("(truncated)") or limit < 20  # the marker only when it fits


@pytest.mark.parametrize(
    "raw, secret",
    [
        ("https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=693a91f6-7xxx", "693a91f6-7xxx"),
        ("https://oapi.dingtalk.com/robot/send?access_token=abc123&timestamp=1&sign=xyz%2B", "abc123"),
        ("https://oapi.dingtalk.com/robot/send?access_token=abc123&timestamp=1&sign=xyz%2B", "xyz%2B"),
        ("https://open.feishu.cn/open-apis/bot/v2/hook/0b9f3c2e-4d5a", "0b9f3c2e-4d5a"),
        ("POST https://sctapi.ftqq.com/SCT123456TabcdEFG.send failed", "SCT123456TabcdEFG"),
        ("https://4321.push.ft07.com/send/sctp4321tQwErTy.send", "sctp4321tQwErTy"),
        ("https://www.pushplus.plus/send/0123456789abcdef0123", "0123456789abcdef0123"),
        ("smtp://me:hunter2@smtp.qq.com:465", "hunter2"),
        ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.abc", "eyJhbGciOiJIUzI1NiJ9.abc"),
        ("export HF_TOKEN=hf_abcdefgh WANDB_API_KEY=0123abcd", "hf_abcdefgh"),
        ("export HF_TOKEN=hf_abcdefgh WANDB_API_KEY=0123abcd", "0123abcd"),
    ],
)
def test_redact_masks_credentials_in_urls_and_logs(raw: str, secret: str) -> None:
    masked = redact(raw)
    assert secret not in masked and "***" in masked


def test_redact_leaves_ordinary_text_alone() -> None:
    text = "job 7 sst2-bert failed: exit code 1 at https://example.com/docs?page=2"
    assert redact(text) == text


def test_notify_error_carries_provider_code_and_redacts_its_message() -> None:
    error = NotifyError("wecom", "bad url https://x/send?key=s3cr3t", retryable=False, code=93000)
    assert (error.code, error.retryable, error.retry_after) == (93000, False, None)
    assert "s3cr3t" not in str(error) + repr(error) + error.provider_message
    assert str(error).startswith("wecom: bad url") and "93000" in str(error)


def test_event_kinds_match_the_daemons_vocabulary() -> None:
    internal = {EventKind.CANCEL_REQUESTED.value, EventKind.NOTIFY_FAILED.value}
    assert set(EVENT_KINDS) == {k.value for k in EventKind} - internal


def test_importing_notifiers_pulls_in_no_heavy_libraries() -> None:
    code = "import sys, notifiers, orchestrator.jobs.outbox; print(sorted({m.split('.')[0] for m in sys.modules}))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    for heavy in ("torch", "lightning", "transformers", "datasets", "apprise"):
        assert f"'{heavy}'" not in loaded
