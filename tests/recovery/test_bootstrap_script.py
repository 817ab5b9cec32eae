"""The bootstrap a replacement machine runs, executed by a real bash with an `orch` on PATH that
records its arguments (what orch itself then does is the adopt and daemon tests' business), and how
it joins a launch template's user data of each kind."""

from __future__ import annotations

import email
import gzip
import os
import subprocess
from pathlib import Path

import pytest

from orchestrator.spec.config import load_config
from orchestrator.home.paths import BOOT_ENV
from orchestrator.recovery.bootstrap import (
    BOOTSTRAP_MARK,
    USER_DATA_LIMIT,
    bootstrap_script,
    check_request,
    decode_user_data,
    with_bootstrap,
)
from orchestrator.recovery.provider import LaunchRequest, RelaunchError

RECORDING_ORCH = '#!/bin/sh\nfor a in "$@"; do printf "%s|" "$a"; done >> "$CALLS"; echo >> "$CALLS"\n'


def _run(tmp_path: Path, script: str, *, with_orch: bool = True, code: int = 0) -> tuple[list[str], str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if with_orch:
        orch = bin_dir / "orch"
        orch.write_text(RECORDING_ORCH)
        orch.chmod(0o755)
    log = tmp_path / "recovery.log"
    script = script.replace("/var/log/orch-recovery.log", str(log))
    calls = tmp_path / "calls"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path / "root"), "CALLS": str(calls)}
    done = subprocess.run(["bash", "-c", script], env=env, timeout=30, cwd=tmp_path)
    assert done.returncode == code
    lines = calls.read_text().splitlines() if calls.exists() else []
    return lines, log.read_text() if log.exists() else ""


def test_bootstrap_adopts_each_job_installs_and_starts_the_daemon_with_a_config_naming_the_mirror(tmp_path):
    url = "s3://bucket/lab $(touch pwned)"  # quoted: never run by the shell
    request = LaunchRequest(url=url, job_uids=("a1", "b2"), market="spot", launch_number=3)

    calls, log = _run(tmp_path, bootstrap_script(request, preemption_source="aws", instance_credentials=True))

    assert calls == [
        f"adopt|{url}|--job|a1|--yes|",
        f"adopt|{url}|--job|b2|--yes|",
        "daemon|install|",
        "daemon|start|",
    ]
    assert not (tmp_path / "pwned").exists()
    config_path = tmp_path / "root" / ".orch" / "config.toml"
    config = load_config(config_path, required=True)
    assert config.storage.url == url
    assert config.preemption.sources == ["aws"]
    assert config.storage.credentials == "instance"  # the instance profile reaches the bucket
    assert oct((tmp_path / "root" / ".orch").stat().st_mode & 0o777) == "0o700"


def test_bootstrap_keeps_an_existing_config_and_says_so_when_orch_is_missing(tmp_path):
    home = tmp_path / "root" / ".orch"
    home.mkdir(parents=True)
    (home / "config.toml").write_text("[pricing]\ngpu_hour = 2.0\n")
    request = LaunchRequest(url="s3://b/p", job_uids=("a1",), market="on-demand", launch_number=1)

    calls, _ = _run(tmp_path, bootstrap_script(request))
    assert calls[0] == "adopt|s3://b/p|--job|a1|--yes|"
    assert (home / "config.toml").read_text() == "[pricing]\ngpu_hour = 2.0\n"

    (tmp_path / "bin" / "orch").unlink()
    os.remove(tmp_path / "calls")
    calls, log = _run(tmp_path, bootstrap_script(request), with_orch=False, code=1)
    assert calls == []
    assert "orch is not installed" in log


def test_bootstrap_reads_the_homes_boot_env_before_running_orch(tmp_path):
    home = tmp_path / "root" / ".orch"
    home.mkdir(parents=True)
    (home / BOOT_ENV).write_text("BOOT_SECRET=from-boot-env\n")
    request = LaunchRequest(url="s3://b/p", job_uids=("a1",), market="spot", launch_number=1)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "orch").write_text('#!/bin/sh\necho "$1 $BOOT_SECRET" >> "$CALLS"\n')
    (bin_dir / "orch").chmod(0o755)

    calls, _ = _run(tmp_path, bootstrap_script(request), with_orch=False)

    assert calls == ["adopt from-boot-env", "daemon from-boot-env", "daemon from-boot-env"]


@pytest.mark.parametrize(
    "request_, problem",
    [
        (LaunchRequest("s3://b/p", ("a1",), "cheap", 1), "market must be"),
        (LaunchRequest("s3://b/p", ("a1; reboot",), "spot", 1), "job uids"),
        (LaunchRequest("s3://b/p", ("a1\n",), "spot", 1), "job uids"),  # a newline would end the script's line
        (LaunchRequest("s3://b/p", (), "spot", 1), "job uids"),
        (LaunchRequest('s3://b/p"\nx', ("a1",), "spot", 1), "mirror URL"),
    ],
)
def test_odd_requests_are_refused_before_anything_launches(request_, problem):
    with pytest.raises(RelaunchError, match=problem):
        check_request(request_, "aws")


SCRIPT = bootstrap_script(LaunchRequest("s3://b/p", ("a1",), "spot", 1))


def _parts(user_data: bytes) -> list[tuple[str, str]]:
    msg = email.message_from_bytes(user_data)
    return [(p.get_content_type(), p.get_payload(decode=True).decode()) for p in msg.walk() if not p.is_multipart()]


def test_user_data_of_each_kind_gets_the_bootstrap():
    assert with_bootstrap(b"", SCRIPT).decode() == SCRIPT

    appended = with_bootstrap(b"#!/bin/bash\npip install /opt/wheels/orch.whl\n", SCRIPT).decode()
    assert appended.startswith("#!/bin/bash\npip install /opt/wheels/orch.whl\n\n" + BOOTSTRAP_MARK)

    gz = with_bootstrap(gzip.compress(b"#!/bin/sh\necho hi\n"), SCRIPT).decode()
    assert gz.startswith("#!/bin/sh\necho hi\n") and BOOTSTRAP_MARK in gz

    # a top-level exit would end one script before orch's part: two parts, each run by cloud-init
    exits = _parts(with_bootstrap(b"#!/bin/bash\nsetup\nexit 0\n", SCRIPT))
    assert [t for t, _ in exits] == ["text/x-shellscript", "text/x-shellscript"]
    assert exits[0][1] == "#!/bin/bash\nsetup\nexit 0\n" and BOOTSTRAP_MARK in exits[1][1]

    multipart = with_bootstrap(with_bootstrap(b"#cloud-config\nruncmd: [ls]\n", "#!/bin/sh\necho first\n"), SCRIPT)
    kinds = [t for t, _ in _parts(multipart)]
    assert kinds == ["text/cloud-config", "text/x-shellscript", "text/x-shellscript"]


@pytest.mark.parametrize(
    "user_data, problem",
    [
        (b"\xff\xfe\x00binary", "neither text nor gzip"),
        (b"\x1f\x8bnot-really-gzip", "does not unpack"),
        (SCRIPT.encode(), "already holds an orch recovery bootstrap"),
        (b"#!/bin/bash\n" + b"# pad\n" * (USER_DATA_LIMIT // 6), "EC2 takes at most"),
        (b"Content-Type: multipart/mixed\nMIME-Version: 1.0\n\nno boundary", "does not parse"),
    ],
)
def test_user_data_orch_cannot_extend_is_refused_clearly(user_data, problem):
    with pytest.raises(RelaunchError, match=problem):
        with_bootstrap(user_data, SCRIPT)


def test_template_user_data_must_be_base64():
    assert decode_user_data(None) == b""
    assert decode_user_data("IyEvYmluL3NoCg==") == b"#!/bin/sh\n"
    with pytest.raises(RelaunchError, match="not valid base64"):
        decode_user_data("not base64!")
