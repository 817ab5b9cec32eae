"""The one redaction rule (orchestrator/redaction.py), case by case, with text from each place that
masks: a notifier's URL, a tracker's error, an object store's error, a line of a diff."""

from __future__ import annotations

import subprocess
import sys

import pytest

from orchestrator.redaction import MASK, environ_secrets, redact


@pytest.mark.parametrize(
    "raw, secret",
    [
        # a tracker's error (the URL's whole user part goes)
        ("POST https://me:pw123@mlflow.lab/api failed", "me:pw123"),
        ("api_key=abcd1234 rejected", "abcd1234"),
        # an object store's error: a presigned URL's signature and session token
        ("403 for https://b.s3.amazonaws.com/k?X-Amz-Signature=f00dfeed&X-Amz-Credential=AKID%2F2024", "f00dfeed"),
        ("403 for https://b.s3.amazonaws.com/k?X-Amz-Signature=f00dfeed&X-Amz-Credential=AKID%2F2024", "AKID%2F2024"),
        ("x-amz-security-token=FQoGZXIvYXdz&x=1", "FQoGZXIvYXdz"),
        # lines of a diff: assignments in code, JSON and YAML, and key shapes with no name at all
        ('+WANDB_API_KEY = "0123456789abcdef"', "0123456789abcdef"),
        ("+    password: 'hunter2hunter2'", "hunter2hunter2"),
        ('+  "client_secret": "s3cr3t-value",', "s3cr3t-value"),
        ('+aws_secret_access_key="wJalrXUtnFEMI/K7MDENG"', "wJalrXUtnFEMI/K7MDENG"),
        ('+ids = ["AKIAIOSFODNN7EXAMPLE"]', "AKIAIOSFODNN7EXAMPLE"),
        ("+login(hf_abcdefghijklmnopqrstuvwxyz)", "hf_abcdefghijklmnopqrstuvwxyz"),
        ("+client = OpenAI(sk-proj-abcdefghijklmnopqrstuv)", "sk-proj-abcdefghijklmnopqrstuv"),
        ("+git clone https://ghp_abcdefghijklmnopqrstuvwxyz0123@github.com/me/x", "ghp_abcdefghijklmnopqrstuvwxyz0123"),
    ],
)
def test_every_kind_of_credential_is_masked(raw: str, secret: str) -> None:
    masked = redact(raw)
    assert secret not in masked and MASK in masked, masked


@pytest.mark.parametrize(
    "text",
    [
        "job 7 sst2-bert failed: exit code 1 at https://example.com/docs?page=2",
        "+    if key == other:",
        "+LR = 0.2",
        "KeyError: 'label' (the data file has no such column)",
    ],
)
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert redact(text) == text


def test_exact_secret_values_are_masked_wherever_they_appear_longest_first() -> None:
    text = "GET https://host/hook/abcdefgh12345678 with abcd and abcdefgh"
    masked = redact(text, ["abcdefgh12345678", "abcdefgh", "abc"])
    assert "abcdefgh" not in masked and masked.count(MASK) == 2
    assert "abcd and" in masked  # a value under 4 characters would mask ordinary words: left


def test_the_secret_variables_values_come_from_the_environment_given() -> None:
    env = {"WANDB_API_KEY": "k" * 40, "HOME": "/root", "HF_TOKEN": ""}
    assert environ_secrets(env) == ["k" * 40]
    assert "k" * 40 not in redact(f"header {'k' * 40}", environ_secrets(env))


def test_a_variable_named_like_a_credential_is_a_secret_and_a_mere_mention_is_not() -> None:
    env = {"ORCH_SMTP_PASSWORD": "hunter2-long", "MY_WEBHOOK_KEY": "abcd1234", "TOKENIZERS_PARALLELISM": "false"}
    assert sorted(environ_secrets(env)) == ["abcd1234", "hunter2-long"]
    assert redact("false, true", environ_secrets(env)) == "false, true"


def test_the_module_is_standard_library_only():
    """training/ imports it before torch, the daemon and the notifiers beside it: nothing heavy
    and nothing of the core may come with it."""
    code = (
        "import sys; before = set(sys.modules); import orchestrator.redaction; "
        "new = set(sys.modules) - before; "
        "print(sorted(m for m in new if m.split('.')[0] not in sys.stdlib_module_names))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['orchestrator', 'orchestrator.redaction']", out
