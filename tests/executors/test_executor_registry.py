"""One registry per kind (issue 44): a new executor is its module and one entry in
model/executor_kinds.py's table, and nothing else. A made-up kind (tests/fake_executor.py) is
registered here and nothing of orch is edited: config.toml accepts it (a misspelling gets a
did-you-mean), the daemon starts and reaps its attempts through it, the price of an hour follows
its billing mode, a multi-node job is admitted as it declares, and `orch doctor` runs its check."""

from __future__ import annotations

from typing import Iterator

import pytest

import fake_executor
from daemon_harness import OrchHome, orch_home  # noqa: F401  (fixture)
from orchestrator.cost.money import Pricing
from orchestrator.executors import build_executor, run_doctor_checks
from orchestrator.jobs.admission import check_nodes
from orchestrator.model.errors import ConfigError, SpecError
from orchestrator.model.executor_kinds import KINDS, ExecutorKind, register
from orchestrator.model.states import JobState
from orchestrator.planning.capacity import gpu_slots
from orchestrator.spec.jobspec import load_jobspec

FAKE = ExecutorKind(
    name="fake",
    builder="fake_executor:FakeExecutor",
    bills_by_allocation=True,
    one_node=None,
    doctor_checks=("fake_executor:doctor_check",),
)


@pytest.fixture
def fake_kind() -> Iterator[ExecutorKind]:
    register(FAKE)
    yield FAKE
    KINDS.pop(FAKE.name, None)


def test_a_new_kind_is_its_module_and_one_registry_entry(orch_home, fake_kind):
    h: OrchHome = orch_home(gpus=[])
    with pytest.raises(ConfigError, match="did you mean 'fake'"):
        h.configure({"executor": {"kind": "fak"}})
    h.configure({"executor": {"kind": "fake"}, "pricing": {"gpu_hour": 2.0, "instance_hour": 10.0}})
    assert build_executor(h.config, h.home).name == "fake"
    assert Pricing.from_config(h.config).instance_hour == 0.0  # billed by allocation, as it declares
    assert gpu_slots(h.config) == []  # on this machine: [daemon] gpus

    spec = load_jobspec(h.job_file("wide", hold="never"))
    spec.nodes = 2
    check_nodes(spec, "wide.toml", "fake")  # it declares multi-node support
    with pytest.raises(SpecError, match="this orch runs jobs on this one machine"):
        check_nodes(spec, "wide.toml", "local")

    d = h.local_daemon()
    job = h.submit("on-fake")
    done = h.tick_state(d, job, JobState.SUCCEEDED)
    assert done.executor == "fake" and fake_executor.STARTED[-1] == job
    assert run_doctor_checks(h.config, h.home) == [("fake", "ok", f"the fake cluster sees {h.home.runs}", "")]


def test_no_module_outside_the_executors_and_the_registry_spells_a_kind():
    """What lets a new kind be its module and one registry entry: no string in orch's code outside
    orchestrator/executors/ and model/executor_kinds.py is a kind's name (a docstring or a sentence
    may mention one; a value compared with or defaulted to one may not: it names the registry's)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "orchestrator"
    allowed = {root / "model" / "executor_kinds.py"}
    found = []
    for path in sorted(root.rglob("*.py")):
        if path in allowed or (root / "executors") in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in KINDS:
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}: {node.value!r}")
    assert found == []
