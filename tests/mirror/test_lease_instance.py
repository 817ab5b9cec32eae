"""The lease names the EC2 instance that holds it (read from IMDSv2 when [preemption] sources has
"aws"), so `orch watch` can ask EC2 whether a silent owner is gone; elsewhere the metadata address
is never asked and the lease has no instance id."""

from __future__ import annotations

import time

from metadata_fakes import FakeAws, closed_port_url, serve  # noqa: F401  (fixtures)
from mirror_harness import ckpt_job, manifest, remote_for, storage_home

from orchestrator.spec.config import load_config
from orchestrator.daemon.mirror import Mirror
from orchestrator.objectstore.manifest_model import Owner
from orchestrator.recovery.aws import lease_instance_id


def _home(tmp_path, preemption: str):
    h = storage_home(tmp_path / "a", f"file://{tmp_path}/mirror")
    config = h.root / "config.toml"
    config.write_text(config.read_text() + preemption)
    h.config = load_config(config, required=True)
    return h


def _owner_after_one_pass(h, name: str) -> dict:
    uid = h.job(ckpt_job(h, name)).uid
    Mirror(h.home, h.config, h.store).pass_once(time.time())  # the daemon's uploader, one pass
    m = manifest(remote_for(h), uid)
    assert m is not None
    return dict(m["owner"])


def test_the_lease_records_the_instance_id_from_imds(tmp_path, serve):
    fake = FakeAws()
    fake.instance_id = (200, "i-0abc1234def567890")
    h = _home(tmp_path, f'\n[preemption]\nsources = ["aws"]\naws_endpoint = "{serve(fake)}"\n')

    owner = _owner_after_one_pass(h, "on-ec2")

    assert owner["instance_id"] == "i-0abc1234def567890"
    assert Owner.model_validate(owner).instance_id == "i-0abc1234def567890"  # what adopt reads
    assert lease_instance_id(owner) == "i-0abc1234def567890"  # what the aws provider asks EC2 about
    assert [p for _, p, _ in fake.requests].count("/latest/meta-data/instance-id") == 1


def test_no_aws_source_means_no_metadata_request_and_no_instance_id(tmp_path, serve):
    fake = FakeAws()
    fake.instance_id = (200, "i-0abc1234def567890")
    h = _home(tmp_path, f'\n[preemption]\naws_endpoint = "{serve(fake)}"\n')

    owner = _owner_after_one_pass(h, "elsewhere")

    assert "instance_id" not in owner
    assert fake.requests == []


def test_an_unreachable_metadata_server_still_writes_the_lease(tmp_path, closed_port_url):
    h = _home(tmp_path, f'\n[preemption]\nsources = ["aws"]\naws_endpoint = "{closed_port_url}"\n')

    owner = _owner_after_one_pass(h, "no-imds")

    assert "instance_id" not in owner and owner["heartbeat"] > 0
