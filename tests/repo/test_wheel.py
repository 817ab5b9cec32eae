"""The package as users install it: the wheel built from this checkout goes into a fresh virtual
environment that already holds torch (as a GPU image's Python does), and from a folder outside the
checkout `orch --help`, `orch example` and a built-in job run from it, with torch left alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    out = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{argv} exited {out.returncode}:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    return out


def test_the_wheel_installs_beside_an_existing_torch_and_runs_a_job_outside_the_checkout(tmp_path: Path):
    import torch

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ORCH_HOME", "ORCH_CONFIG")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", ORCH_HOME=str(tmp_path / "home"))
    run(
        [sys.executable, "-m", "build", "--no-isolation", "--wheel", "--outdir", str(tmp_path / "dist"), str(REPO)],
        REPO,
        env,
    )
    (wheel,) = (tmp_path / "dist").glob("orch_gpu-*.whl")

    # The image: a fresh venv whose Python already sees torch (and the other libraries) through a
    # site folder of its own, as --system-site-packages over an image's Python would.
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, env)
    python = venv / "bin" / "python"
    image_site = Path(torch.__file__).resolve().parents[1]
    fresh_site = Path(
        run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path, env
        ).stdout.strip()
    )
    (fresh_site / "_image_site.pth").write_text(f"{image_site}\n")
    assert fresh_site != Path(sysconfig.get_paths()["purelib"])

    run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-index", str(wheel)], tmp_path, env
    )
    assert not (fresh_site / "torch").exists()  # torch was not replaced: still the image's
    where = run(
        [
            str(python),
            "-c",
            "import torch, orchestrator; print(torch.__file__, torch.__version__, orchestrator.__file__)",
        ],
        tmp_path,
        env,
    ).stdout.split()
    assert where == [torch.__file__, torch.__version__, str(fresh_site / "orchestrator" / "__init__.py")], where

    orch = str(venv / "bin" / "orch")
    assert "Usage: orch" in run([orch, "--help"], tmp_path, env).stdout
    listed = run([orch, "example"], tmp_path, env).stdout
    assert "quickstart" in listed and "plain-pytorch" in listed
    wrote = run([orch, "example", "quickstart", "ex"], tmp_path, env).stdout
    assert "next: python" in wrote
    example = tmp_path / "ex" / "quickstart"
    assert {p.name for p in example.iterdir()} == {"job.toml", "prepare.py"}
    run([str(python), str(example / "prepare.py")], tmp_path, env)

    job = example / "short.toml"  # the quickstart's model and data, a few steps
    job.write_text(
        'name = "from-the-wheel"\ngpus = 0\n[model]\nname_or_path = "./tiny-bert"\nnum_labels = 2\n'
        '[data]\ntrain = "./data/train.jsonl"\nvalidation = "./data/dev.jsonl"\nmax_length = 32\nnum_workers = 0\n'
        '[train]\nmax_steps = 4\nbatch_size = 16\nprecision = "32"\n[checkpoint]\nevery_n_steps = 2\n'
    )
    run([orch, "run", str(job)], tmp_path, env)
    shown = json.loads(run([orch, "show", "1", "--json"], tmp_path, env).stdout)
    assert shown["state"] == "succeeded" and shown["result"]["steps"] == 4
    # provenance: the environment the job really ran in, this wheel included
    prov = tmp_path / "home" / "runs" / "1" / "provenance"
    assert "orch-gpu==" in (prov / "packages.txt").read_text()
    system = json.loads((prov / "system.json").read_text())
    assert system["python"]["executable"] == str(python) and system["runtime"]["torch"] == torch.__version__
