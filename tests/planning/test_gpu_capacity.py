"""GPU capacity is derived in one place (planning/capacity.py, issue 28 defect 4): on Slurm the
CLI's views (`orch status`'s deadline forecast, the bill, `orch estimate`, `orch submit`) and the
daemon size the cluster the same way, never with the login node's own GPUs."""

from __future__ import annotations

import pytest

from orchestrator.daemon.tick import Daemon
from orchestrator.home.paths import Home
from orchestrator.planning.capacity import gpu_slots, machine_gpus
from orchestrator.spec.config import load_config
from orchestrator.store import Store
from orchestrator.views.deadlines import _capacity


@pytest.mark.parametrize(
    "toml, slots",
    [
        ('[daemon]\ngpus = [0]\n[executor]\nkind = "slurm"\n[slurm]\nmax_gpus = 3\n', [0, 1, 2]),
        ("[daemon]\ngpus = [2, 0]\n", [0, 2]),
        ('[daemon]\ngpus = []\n[executor]\nkind = "slurm"\n[slurm]\nmax_gpus = 0\n', []),
    ],
)
def test_the_cli_and_the_daemon_count_the_same_gpus(tmp_path, toml, slots):
    home = Home(tmp_path / "home").ensure()
    (home.root / "config.toml").write_text(toml)
    config = load_config(home.root / "config.toml", required=True)
    assert gpu_slots(config) == slots
    assert _capacity(config) == (len(slots), config.daemon.cpu_slots)  # `orch status`'s forecast
    store = Store(home.db)
    try:
        assert Daemon(home, config, store, environ={}).managed == slots  # dispatch and the deadline watch
    finally:
        store.close()
    assert machine_gpus(config) == sorted(config.daemon.gpus)  # where `orch run` runs its job
