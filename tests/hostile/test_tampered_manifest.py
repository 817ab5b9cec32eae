"""`orch adopt` treats the mirror as untrusted input: a manifest that names paths outside the home,
has a wrong type, a missing key, an absurd value or is not a manifest at all is refused before any
lease, row or file, with the job, the field and the value named, exit 2, no traceback, and nothing
written anywhere (the store included). A tar that does not unpack safely is a rejected checkpoint:
the adoption falls back to the previous one."""

from __future__ import annotations

import hashlib
import io
import json
import sqlite3
import tarfile
from pathlib import Path
from typing import Optional

import pytest

from mirror_setup import make_origin, tampered
from orchestrator.objectstore import manifest as mf


@pytest.fixture(scope="module")
def origin(tmp_path_factory):
    folder = tmp_path_factory.mktemp("origin")
    return make_origin(folder)


def _rows(home: Path) -> int:
    if not (home / "orch.db").exists():
        return 0
    conn = sqlite3.connect(home / "orch.db")
    try:
        return conn.execute("SELECT COUNT(*) FROM jobs").fetchone()[0]
    finally:
        conn.close()


def _data_file(remote, rel: str, root: str = "/datasets/train") -> dict:
    data = b"some training rows\n"
    sha = hashlib.sha256(data).hexdigest()
    remote.put_bytes(f"data/{sha}", data)
    return {"role": "data.train", "root": root, "rel": rel, "sha256": sha, "bytes": len(data), "key": f"data/{sha}"}


def _set(path: str, value):
    """A change that sets manifest[path...] = value (path dotted, list indexes as numbers)."""

    def change(m, remote):
        target, parts = m, path.split(".")
        for p in parts[:-1]:
            target = target[int(p)] if p.isdigit() else target[p]
        target[int(parts[-1]) if parts[-1].isdigit() else parts[-1]] = value(remote) if callable(value) else value

    return change


def _delete(key: str):
    def change(m, remote):
        del m[key]

    return change


def _add_data(rel: str, root: str = "/datasets/train"):
    def change(m, remote):
        m["data_files"] = [_data_file(remote, rel, root)]

    return change


ESCAPE = "ESCAPE"  # replaced by an absolute path inside the sandbox, outside the home

# (case, change, words the refusal must hold)
CASES = [
    (
        "checkpoint name climbs out",
        _set("checkpoints.0.name", "../../../../escape.ckpt"),
        ["checkpoints[0]", "../../../../escape.ckpt"],
    ),
    ("checkpoint name absolute", _set("checkpoints.0.name", ESCAPE), ["checkpoints[0]", "escape"]),
    (
        "checkpoint name in a sub-folder",
        _set("checkpoints.0.name", "x/step-00000020.ckpt"),
        ["checkpoints[0]", "x/step"],
    ),
    ("checkpoint name not the contract's", _set("checkpoints.0.name", "model.pt"), ["checkpoints[0]", "model.pt"]),
    (
        "checkpoint key of another job",
        _set("checkpoints.0.key", "jobs/other/checkpoints/x"),
        ["checkpoints[0].key", "jobs/other"],
    ),
    (
        "checkpoint key climbs out",
        _set("checkpoints.0.key", "../../../etc/passwd"),
        ["checkpoints[0].key", "../../../etc/passwd"],
    ),
    ("sha256 not hex", _set("checkpoints.0.sha256", "zz" * 32), ["checkpoints[0].sha256"]),
    ("size negative", _set("checkpoints.0.bytes", -1), ["checkpoints[0].bytes"]),
    ("data file climbs out", _add_data("../../../escape.txt"), ["data_files[0].rel"]),
    ("data file absolute", _add_data(ESCAPE), ["data_files[0].rel"]),
    ("data file root is ..", _add_data("a.txt", root="/datasets/.."), ["data_files[0].root", "/datasets/.."]),
    ("data file key not its sha", _add_data("a.txt"), None),  # replaced below
    ("wrong type", _set("gpus", "two"), ["gpus", "two"]),
    ("missing state", _delete("state"), ["state", "is required"]),
    ("missing spec", _delete("spec"), ["spec", "is required"]),
    ("nul in the command", _set("spec.command", ["python", "-c", "pass\u0000"]), ["spec", "command[2]"]),
    ("name with a slash", _set("name", "../x"), ["name", "../x"]),
    ("name with a newline", _set("name", "a\nb"), ["name"]),
    ("priority past 64 bits", _set("priority", 2**70), ["priority"]),
    ("uid of another job", _set("uid", "f" * 32), ["uid"]),
    ("not json", lambda m, r: b"{not json", ["not a JSON manifest"]),
    ("not an object", lambda m, r: b"[1, 2, 3]", ["not an orch manifest"]),
    (
        "nested a million deep",
        lambda m, r: b'{"uid": "x", "a": ' + b"[" * 1_000_000 + b"]" * 1_000_000 + b"}",
        ["nested"],
    ),
    ("bigger than the limit", lambda m, r: mf.dump(dict(m, pad="x" * (17 * 1024 * 1024))), ["limit"]),
]


def _data_key_mismatch(m, remote):
    entry = _data_file(remote, "a.txt")
    entry["key"] = "data/../../../escape"
    m["data_files"] = [entry]


CASES[11] = ("data file key not its sha", _data_key_mismatch, ["data_files[0]", "key"])


@pytest.mark.parametrize("case,change,words", CASES, ids=[c[0] for c in CASES])
def test_a_tampered_manifest_is_refused_before_anything_is_written(sandbox, origin, case, change, words):
    pristine, uid = origin
    escape = str(sandbox.root / "escape.ckpt")

    def edit(m, remote):
        out = change(m, remote)
        text = json.dumps(m).replace(json.dumps(ESCAPE), json.dumps(escape))
        m.clear()
        m.update(json.loads(text))
        return out

    store_dir = tampered(pristine, sandbox.root / "store", uid, edit)
    sandbox.orch("status").clean(0)
    sandbox.mark()
    ran = sandbox.orch("adopt", f"file://{store_dir}", "--job", uid, "--yes").clean(2)
    assert f"job {uid[:12]}" in ran.err, ran.err
    for word in words:
        assert word in ran.err, (word, ran.err)
    assert "adopted" not in ran.out
    assert _rows(sandbox.home) == 0
    assert not (sandbox.home / "runs" / "1").exists() and not (sandbox.home / "data").exists()
    sandbox.assert_nothing_outside_home()  # the store too: no lease was taken


def _tar_bytes(members: dict[str, bytes], links: Optional[dict[str, str]] = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return buf.getvalue()


BAD_TARS = [
    ("member climbs out", _tar_bytes({"ok.bin": b"x", "../../../../tar-escape.txt": b"pwned"})),
    ("link out of the folder", _tar_bytes({"ok.bin": b"x"}, links={"evil": "/etc"})),
    ("link climbing out", _tar_bytes({}, links={"evil": "../../../../.."})),
    ("not a tar", b"\x00garbage" * 100),
]


@pytest.mark.parametrize("case,payload", BAD_TARS, ids=[c[0] for c in BAD_TARS])
def test_a_tar_that_does_not_unpack_safely_is_a_rejected_checkpoint(sandbox, origin, case, payload):
    pristine, uid = origin

    def pack_newest(m, remote):
        newest = m["checkpoints"][0]
        sha = hashlib.sha256(payload).hexdigest()  # whoever writes the manifest writes the object too
        newest.update(packed="tar", sha256=sha, bytes=len(payload), key=mf.checkpoint_key(uid, newest["name"], sha))
        remote.put_bytes(newest["key"], payload)

    store_dir = tampered(pristine, sandbox.root / "store", uid, pack_newest)
    sandbox.orch("status").clean(0)
    sandbox.mark(store_dir)  # the adoption takes the lease there: expected
    ran = sandbox.orch("adopt", f"file://{store_dir}", "--job", uid, "--yes").clean(0)
    assert "does not unpack safely" in ran.err, ran.err
    assert "resuming from step 10 (step-00000010.ckpt" in ran.out, ran.out
    ckpts = sandbox.home / "runs" / "1" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-00000010.ckpt"]  # no half folder, no temp tar
    sandbox.assert_nothing_outside_home()


def test_job_reads_only_the_manifests_asked_for(sandbox, origin):
    pristine, uid = origin

    def add_broken_neighbour(m, remote):
        remote.put_bytes(mf.manifest_key("0123456789abcdef0123456789abcdef"), b"\x00 not json")

    store_dir = tampered(pristine, sandbox.root / "store", uid, add_broken_neighbour)
    ran = sandbox.orch("adopt", f"file://{store_dir}", "--job", uid[:8], "--yes").clean(0)
    assert "0123456789ab" not in ran.out + ran.err, ran  # never read
    assert "adopted" in ran.out
    everything = sandbox.orch("adopt", f"file://{store_dir}", "--all", "--yes").clean(1)  # already here + broken
    assert "job 0123456789ab" in everything.err and "not a JSON manifest" in everything.err, everything.err


def test_a_command_manifest_without_a_workdir_runs_in_its_run_folder_and_says_so(sandbox, origin):
    # It printed "(in ?)", and the job then ran wherever the daemon had been started.
    from orchestrator.jobs.attempts import job_argv
    from orchestrator.store import Store

    pristine, uid = origin

    def drop_workdir(m, remote):
        m["spec"].pop("workdir", None)

    store_dir = tampered(pristine, sandbox.root / "store", uid, drop_workdir)
    ran = sandbox.orch("adopt", f"file://{store_dir}", "--job", uid, "--yes").clean(0)
    assert "(in its run folder: the manifest names no workdir)" in ran.out, ran.out
    job = Store(sandbox.home / "orch.db").get(1)
    run_dir = sandbox.home / "runs" / "1"
    assert job_argv(job.spec, run_dir)[1] == str(run_dir), job.spec.get("workdir")
