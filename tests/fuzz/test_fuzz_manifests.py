"""Property-based fuzzing (hypothesis) of mirrored manifests: whatever a manifest holds (real
fields given random or hostile values, keys deleted, any JSON at all), `orch adopt` either refuses
it with an OrchError naming the job or adopts it cleanly, never raises anything else, and never
writes outside ORCH_HOME and the store. Each example runs the real adoption (real file:// store,
real SQLite, real downloads) in a fresh home."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from orchestrator.adopt import adopt_jobs
from orchestrator.spec.config import StorageSection, load_config
from orchestrator.model.errors import OrchError
from orchestrator.jobs.lifecycle import submit_job
from orchestrator.home.paths import Home
from orchestrator.objectstore import manifest as mf
from orchestrator.objectstore.remote import Remote
from orchestrator.store import Store

EXAMPLES = 300
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)

HOSTILE_TEXT = [
    "../escape",
    "../../../../escape.ckpt",
    "/tmp/orch-fuzz-escape",
    "..",
    ".",
    "",
    "a\x00b",
    "x\ny",
    "\x1b[2J",
    "step-00000001.ckpt",
    "notice-step-00000002.ckpt",
    "sub/step-00000001.ckpt",
    "jobs/other/checkpoints/x",
    "data/../../escape",
    "0" * 64,
    "f" * 64,
    "tar",
    "queued",
    "running",
    "command",
    "builtin",
    "/datasets/train",
    "/",
    "//x",
    "C:\\x",
    "é" * 3,
]
text = st.one_of(st.sampled_from(HOSTILE_TEXT), st.text(max_size=12))
scalars = st.one_of(
    text,
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(-3, 100),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(text, inner, max_size=3)),
    max_leaves=6,
)


def _paths(m: Any, prefix: tuple = ()) -> list[tuple]:
    """Every place in the pristine manifest a value can be put (dict keys and list indexes)."""
    out = []
    if isinstance(m, dict):
        for k, v in m.items():
            out.append(prefix + (k,))
            out += _paths(v, prefix + (k,))
    elif isinstance(m, list):
        for i, v in enumerate(m):
            out.append(prefix + (i,))
            out += _paths(v, prefix + (i,))
    return out


@pytest.fixture(scope="module")
def origin(tmp_path_factory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("fuzz-origin")
    home = Home(folder / "origin-home").ensure()
    store = Store(home.db)
    job_toml = folder / "job.toml"
    job_toml.write_text(f'name = "victim"\ngpus = 0\ncommand = {json.dumps([sys.executable, "-c", "pass"])}\n')
    job = submit_job(store, load_config(home.config_path()), home, job_toml, now=time.time(), machine_gpus=0)
    store_dir = folder / "store"
    remote = Remote(StorageSection(url=f"file://{store_dir}"))
    records = []
    for step in (20, 10):
        name, data = f"step-{step:08d}.ckpt", f"state {step}".encode()
        sha = hashlib.sha256(data).hexdigest()
        key = mf.checkpoint_key(job.uid, name, sha)
        remote.put_bytes(key, data)
        records.append({"name": name, "step": step, "notice": False, "key": key, "sha256": sha, "bytes": len(data)})
    rows = b"rows\n"
    rows_sha = hashlib.sha256(rows).hexdigest()
    remote.put_bytes(f"data/{rows_sha}", rows)
    manifest = mf.build_manifest(
        store.get(job.id),
        [],
        home_id="origin",
        checkpoints=records,
        batch={"history": []},
        progress={"step": 20},
        released=True,
        data_files=[
            {
                "role": "data.train",
                "root": "/nowhere/train.jsonl",
                "rel": "",
                "sha256": rows_sha,
                "bytes": len(rows),
                "key": f"data/{rows_sha}",
            }
        ],
    )
    manifest = json.loads(mf.dump(manifest))
    store.close()
    return {
        "store": store_dir,
        "uid": job.uid,
        "manifest": manifest,
        "paths": _paths(manifest),
        "work": folder / "examples",
    }


def _listing(root: Path, skip: set[str]) -> set[str]:
    out = set()
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if os.path.join(folder, d) not in skip]
        out.update(os.path.join(folder, n) for n in dirs + files)
    return out


edits = st.lists(
    st.one_of(
        st.tuples(st.just("set"), st.integers(0, 10**6), values),
        st.tuples(st.just("delete"), st.integers(0, 10**6), st.none()),
    ),
    min_size=1,
    max_size=4,
)
whole = st.one_of(st.none(), values.map(lambda v: json.dumps(v, default=str).encode()), st.binary(max_size=40))


def _apply(m: dict[str, Any], paths: list[tuple], ops: list[tuple]) -> dict[str, Any]:
    m = copy.deepcopy(m)
    for op, index, value in ops:
        path = paths[index % len(paths)]
        parent: Any = m
        try:
            for part in path[:-1]:
                parent = parent[part]
            if op == "set":
                parent[path[-1]] = value
            elif isinstance(parent, dict):
                parent.pop(path[-1], None)
            else:
                del parent[path[-1]]
        except (KeyError, IndexError, TypeError):
            continue  # an earlier edit changed the shape: skip
    return m


@FUZZ
@given(ops=edits, raw=whole)
def test_any_manifest_is_refused_or_adopted_cleanly_and_nothing_escapes(origin, ops, raw):
    origin["work"].mkdir(exist_ok=True)
    sandbox = Path(tempfile.mkdtemp(dir=origin["work"]))
    try:
        store_dir = sandbox / "store"
        shutil.copytree(origin["store"], store_dir)
        key_path = store_dir / mf.manifest_key(origin["uid"])
        body = (
            raw
            if raw is not None
            else json.dumps(_apply(origin["manifest"], origin["paths"], ops), default=str).encode()
        )
        key_path.write_bytes(body)
        home = Home(sandbox / "home").ensure()
        before = _listing(sandbox, {str(home.root), str(store_dir)})
        store = Store(home.db)
        said: list[str] = []
        try:
            adopted, refused = adopt_jobs(
                home,
                load_config(home.config_path()),
                store,
                f"file://{store_dir}",
                wanted=[origin["uid"]],
                take_all=False,
                force=True,
                say=said.append,
                warn=said.append,
                confirm=lambda lines: True,
            )
        except OrchError as exc:  # a usage error (e.g. the manifest is no longer findable): fine, said clearly
            assert str(exc)
            adopted, refused = [], []
        finally:
            store.close()
        event("adopted" if adopted else "refused")
        for r in refused:
            assert f"job {origin['uid'][:12]}" in str(r), str(r)
        assert _listing(sandbox, {str(home.root), str(store_dir)}) == before
        assert not os.path.exists("/tmp/orch-fuzz-escape")
        for a in adopted:  # adopted cleanly: a job row and its run folder, inside the home
            assert (home.run_dir(a.job_id) / "job.toml").is_file()
    finally:
        shutil.rmtree(sandbox, ignore_errors=True)
