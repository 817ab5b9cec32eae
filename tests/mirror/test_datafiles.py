"""Input files travel with a built-in job: fingerprinted and uploaded once (content-addressed,
shared by jobs), found again on adoption at the old path, through --map, or downloaded; above
[storage] data_max_mb they are only fingerprinted and a missing one is named."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from mirror_harness import manifest, remote_for, storage_home

from orchestrator.daemon.mirror import Mirror
from orchestrator.jobs.lifecycle import submit_job


def _job(h, folder: Path, name: str) -> int:
    data, model = folder / "data", folder / "model"
    data.mkdir(parents=True, exist_ok=True)
    model.mkdir(parents=True, exist_ok=True)
    (data / "train.jsonl").write_text('{"text": "good", "label": 1}\n' * 50)
    (model / "config.json").write_text('{"model_type": "bert"}')
    (model / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    toml = folder / f"{name}.toml"
    toml.write_text(
        f'name = "{name}"\ngpus = 0\n[model]\nname_or_path = "{model}"\n[data]\ntrain = "{data / "train.jsonl"}"\n'
    )
    return submit_job(h.store, h.config, h.home, toml, now=time.time(), machine_gpus=0).id


@pytest.fixture
def mirrored(s3_server, s3_env, tmp_path):
    def make(**storage):
        url = f"s3://{s3_server.bucket()}/orch"
        a = storage_home(tmp_path / "a", url, s3_server.endpoint, **storage)
        job_id = _job(a, tmp_path / "inputs", "dj")
        _job(a, tmp_path / "inputs", "dj2")  # same files: one object each in the store
        Mirror(a.home, a.config, a.store).pass_once(time.time())  # the daemon's uploader, one pass
        return a, url, a.job(job_id).uid

    return make


def test_inputs_travel_content_addressed_and_are_found_or_downloaded_on_adoption(mirrored, tmp_path):
    a, url, uid = mirrored()
    remote = remote_for(a)
    m = manifest(remote, uid)
    roles = {e["role"] for e in m["data_files"]}
    assert roles == {"data.train", "model.name_or_path"} and all(e["key"] for e in m["data_files"])
    assert len(remote.list("data")) == 3  # train.jsonl, config.json, vocab.txt: shared by both jobs

    b = storage_home(tmp_path / "b", url, a.config.storage.endpoint)
    same = b.cli("adopt", "--yes", url, "--job", "dj", "--force")
    assert same.returncode == 0, same
    assert b.job(b.store.by_uid(uid).id).spec["data"]["train"] == str(tmp_path / "inputs" / "data" / "train.jsonl")

    shutil.rmtree(tmp_path / "inputs")  # a new machine without the inputs: they come from the mirror
    c = storage_home(tmp_path / "c", url, a.config.storage.endpoint)
    got = c.cli("adopt", "--yes", url, "--job", "dj", "--force")
    assert got.returncode == 0 and "downloaded to" in got.stderr, got
    spec = c.job(c.store.by_uid(uid).id).spec
    assert spec["data"]["train"].startswith(str(c.root / "data"))
    assert Path(spec["data"]["train"]).read_text().count("good") == 50
    assert (Path(spec["model"]["name_or_path"]) / "vocab.txt").exists()


def test_inputs_above_the_limit_are_named_when_missing_and_found_through_map(mirrored, tmp_path):
    a, url, uid = mirrored(data_max_mb=0)
    m = manifest(remote_for(a), uid)
    assert m["data_files"] and not any(e["key"] for e in m["data_files"])
    shutil.move(str(tmp_path / "inputs"), str(tmp_path / "moved"))
    b = storage_home(tmp_path / "b", url, a.config.storage.endpoint)
    refused = b.cli("adopt", "--yes", url, "--job", "dj", "--force")
    assert refused.returncode == 1 and "data.train" in refused.stderr and "--map" in refused.stderr, refused
    assert b.store.by_uid(uid) is None
    ok = b.cli("adopt", "--yes", url, "--job", "dj", "--force", "--map", f"{tmp_path / 'inputs'}={tmp_path / 'moved'}")
    assert ok.returncode == 0, ok
    spec = b.job(b.store.by_uid(uid).id).spec
    assert spec["data"]["train"] == str(tmp_path / "moved" / "data" / "train.jsonl")
    assert spec["model"]["name_or_path"] == str(tmp_path / "moved" / "model")
