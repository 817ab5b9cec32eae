"""The built-in runner's periodic checkpoints are named by Lightning's ModelCheckpoint from the
contract's template: the file it writes is exactly periodic_name(step), which the daemon parses."""

from __future__ import annotations

from pathlib import Path

from orchestrator.contract import PERIODIC_FILENAME_TEMPLATE, parse_checkpoint_name, periodic_name


def test_lightning_names_a_periodic_checkpoint_as_the_contract_does(tmp_path):
    from pytorch_lightning.callbacks import ModelCheckpoint

    checkpoint = ModelCheckpoint(
        dirpath=str(tmp_path), filename=PERIODIC_FILENAME_TEMPLATE, auto_insert_metric_name=False, save_top_k=-1
    )
    for step in (0, 7, 12_345_678, 123_456_789):
        written = Path(checkpoint.format_checkpoint_name({"step": step}))
        assert written.name == periodic_name(step)
        assert parse_checkpoint_name(written) == (step, False)
