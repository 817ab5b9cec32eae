"""scripts/gpu-check.sh: the CPU rehearsal of the GPU check runs every section for real (tiny
models, real runner processes, a real daemon) and writes the report; the frame fails the run when
a section fails; the wheel planner installs only what a machine lacks and never its torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu-check.sh"
KEYS = ["precision", "throughput", "oom", "resume", "notice", "daemon_idle", "fsdp"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env.update({"PYTHON": sys.executable, "GPUCHECK_WHEELS": "/nonexistent", **extra})
    return env


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_cpu_rehearsal_passes_every_section_and_writes_the_report(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(
        ["bash", str(SCRIPT), "--cpu", str(out), "--budget-s", "480"],
        cwd=str(REPO),
        env=_env(),
        capture_output=True,
        text=True,
        timeout=880,
    )
    report = json.loads((out / "report.json").read_text())
    assert report["schema"] == 1 and report["mode"] == "cpu"
    assert [s["key"] for s in report["sections"]] == KEYS
    assert [s["letter"] for s in report["sections"]] == list("abcdefg")
    for s in report["sections"]:
        assert s["status"] in ("pass", "skipped"), (
            s["key"],
            s["reason"],
            [c for c in s["checks"] if not c["ok"]],
            done.stderr[-3000:],
        )
        if s["status"] == "skipped":
            assert s["reason"], s
        else:
            assert s["checks"] and all(c["ok"] for c in s["checks"]), s
            assert s["headline"], s
    assert done.returncode == 0, done.stderr[-3000:]
    assert report["ok"] is True
    summary = (out / "summary.md").read_text()
    assert "| a | built-in runner" in summary and "SIMULATED" in summary
    assert (out / "logs.tar.gz").stat().st_size > 0
    by_key = {s["key"]: s for s in report["sections"]}
    # what each figure rests on, where the section ran
    if by_key["precision"]["status"] == "pass":
        fig = by_key["precision"]["figures"]
        assert fig["16-mixed"]["ran_as"] == "32" and fig["bf16-mixed"]["ran_as"] == "bf16-mixed"
        assert fig["16-mixed"]["samples_per_s"] > 0
    if by_key["oom"]["status"] == "pass":
        assert by_key["oom"]["figures"]["simulated"] is True
        assert any("SIMULATED" in n for n in by_key["oom"]["notes"])
    if by_key["resume"]["status"] == "pass":
        assert by_key["resume"]["figures"]["det"]["unequal_tensors"] == 0
    if by_key["notice"]["status"] == "pass":
        fig = by_key["notice"]["figures"]
        assert len(fig["orch_s"]) == 2 and all(a["steps_lost"] == 0 for a in fig["attempts"])
    if by_key["daemon_idle"]["status"] == "pass":
        assert by_key["daemon_idle"]["figures"]["gpu_idle_s"] > 0


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_on_a_gpu_every_section_passes(tmp_path):
    """The real thing, where a CUDA GPU is visible (never in CI): about 6-8 minutes."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    out = tmp_path / "out"
    done = subprocess.run(
        ["bash", str(SCRIPT), str(out)],
        cwd=str(REPO),
        env=_env(GPUCHECK_WHEELS=str(REPO / "wheels")),
        capture_output=True,
        text=True,
        timeout=880,
    )
    report = json.loads((out / "report.json").read_text())
    assert report["mode"] == "gpu"
    failed = {s["key"]: s["reason"] for s in report["sections"] if s["status"] != "pass"}
    assert not failed, (failed, done.stderr[-3000:])
    assert done.returncode == 0


def test_a_failing_section_fails_the_run_and_a_skip_keeps_its_reason(tmp_path, monkeypatch):
    from tools.gpucheck import check, sections
    from tools.gpucheck.frame import Skip

    def good(ctx, sec):
        sec.check("fine", True)
        sec.headline = "ok"

    def bad(ctx, sec):
        sec.check("a figure missed its goal", False, "0.5 < 0.98")

    def skip(ctx, sec):
        raise Skip("nothing to do here")

    def boom(ctx, sec):
        raise RuntimeError("the check itself broke")

    monkeypatch.setattr(
        sections,
        "SECTIONS",
        [
            ("one", "a", "good", good, 0),
            ("two", "b", "bad", bad, 0),
            ("three", "c", "skip", skip, 0),
            ("four", "d", "boom", boom, 0),
        ],
    )
    code = check.main(["--cpu", str(tmp_path / "out"), "--work", str(tmp_path / "work")])
    assert code == 1
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    status = {s["key"]: (s["status"], s["reason"]) for s in report["sections"]}
    assert status["one"] == ("pass", "")
    assert status["two"] == ("fail", "failed: a figure missed its goal")
    assert status["three"] == ("skipped", "nothing to do here")
    assert status["four"][0] == "fail" and "the check itself broke" in json.dumps(report["sections"][3]["checks"])
    assert report["ok"] is False
    assert "**FAIL**" in (tmp_path / "out" / "summary.md").read_text()


def test_without_a_gpu_the_gpu_mode_refuses_and_points_to_cpu(tmp_path):
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    done = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "out")],
        cwd=str(REPO),
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "--cpu" in done.stderr
    done = subprocess.run(["bash", str(SCRIPT)], cwd=str(REPO), env=_env(), capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "gpu-check.sh" in done.stdout


def _wheel(folder: Path, name: str, version: str, requires: list[str]) -> Path:
    dist = f"{name.replace('-', '_')}-{version}.dist-info"
    path = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    meta = "Metadata-Version: 2.1\nName: {}\nVersion: {}\n{}".format(
        name, version, "".join(f"Requires-Dist: {r}\n" for r in requires)
    )
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name.replace('-', '_')}_mod.py", f"VERSION = {version!r}\n")
        zf.writestr(f"{dist}/METADATA", meta)
        zf.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{dist}/RECORD", "")
    return path


def test_wheel_plan_installs_only_what_is_missing_or_too_old_and_never_torch(tmp_path, monkeypatch):
    from tools.gpucheck.wheels import install, plan

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "orch-fake-missing", "1.0", ["orch-fake-dep>=2"])
    _wheel(wheels, "orch-fake-dep", "2.1", [])
    _wheel(wheels, "orch-fake-unused", "1.0", [])  # nobody asks for it
    _wheel(wheels, "torch", "9.9", [])  # a wheel of the machine's stack is never installed
    _wheel(wheels, "typer", "0.19.2", [])
    machine = {"typer": "0.25.0", "torch": "2.11.0", "orch-fake-dep": "1.0"}
    project = ["orch-fake-missing>=1", "torch>=3", "typer>=0.19.2,<0.20"]
    result = plan(wheels, project=project, installed=lambda n: machine.get(n.lower()))
    assert set(result["install"]) == {
        "orch_fake_missing-1.0-py3-none-any.whl",
        "orch_fake_dep-2.1-py3-none-any.whl",
        "typer-0.19.2-py3-none-any.whl",
    }
    assert result["install"]["orch_fake_missing-1.0-py3-none-any.whl"] == "missing on this machine"
    why = result["install"]["orch_fake_dep-2.1-py3-none-any.whl"]
    assert "does not satisfy orch-fake-missing's orch-fake-dep>=2" in why
    assert any("torch>=3" in u and "protected" in u for u in result["unmet"])

    # a real pip install --no-index --target of what this environment lacks
    real = tmp_path / "real"
    real.mkdir()
    _wheel(real, "orch-fake-missing", "1.0", [])
    target = tmp_path / "site"
    from tools.gpucheck import wheels as w

    monkeypatch.setattr(w, "project_requirements", lambda pyproject=None: ["orch-fake-missing>=1", "pydantic>=2"])
    done = install(real, target)
    assert list(done["install"]) == ["orch_fake_missing-1.0-py3-none-any.whl"]
    assert (target / "orch_fake_missing_mod.py").exists()
    assert json.loads((target / "gpucheck-wheels.json").read_text())["install"]


def test_fetch_list_leaves_out_the_machines_stack():
    from tools.gpucheck.wheels import closure, is_protected

    found, _ = closure()
    assert {"pydantic", "pydantic-core", "datasets", "apscheduler", "torchdata", "tomli-w"} <= set(found)
    assert not [n for n in found if is_protected(n)]
    assert "pyarrow" not in found and "numpy" not in found and "torch" not in found
