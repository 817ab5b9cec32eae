"""The bootstrap's edges, fast: `instrument` in job.toml (command jobs only), the versions refused at
submit with one line (exit 2) and by the job itself with one line (exit 78, job_error.json), the
interpreter found behind a console script, a user's own sitecustomize still run, a program that
imports neither framework left alone, and the resume point: the newest whole checkpoint among
orch's links and the program's own `checkpoint-N` folders."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from instrument_programs import NEITHER, write

from orchestrator.contract import ENV_ATTEMPT, ENV_CKPT_DIR, ENV_RESUME_FROM, ENV_RUN_DIR, periodic_name
from orchestrator.jobs.instrument import boot_dir, instrument_env, job_python

REPO = Path(__file__).resolve().parents[2]


def run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env["PYTHONPATH"] = str(REPO)
    return env


@pytest.fixture(scope="module")
def old_transformers(tmp_path_factory) -> Path:
    """A bare venv (no pip) whose site-packages holds a transformers 4.20.0 that is only a
    distribution record and a `transformers/trainer.py` with a Trainer class."""
    root = tmp_path_factory.mktemp("old-venv")
    venv.create(root, with_pip=False, symlinks=True)
    site = next(root.glob("lib/python*/site-packages"))
    dist = site / "transformers-4.20.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: transformers\nVersion: 4.20.0\n")
    (site / "transformers").mkdir()
    (site / "transformers" / "__init__.py").write_text("")
    (site / "transformers" / "trainer.py").write_text("class Trainer:\n    pass\n")
    return root


@pytest.mark.parametrize(
    "text, says",
    [
        (
            'instrument = "auto"\n[model]\nname_or_path = "bert-base-uncased"\nnum_labels = 2\n[data]\ntrain = "hub/id"\n',
            "instrument: 'auto' is for command jobs",
        ),
        ('command = ["python", "x.py"]\ninstrument = "keras"\n', "instrument"),
    ],
)
def test_instrument_is_refused_at_submit_outside_command_jobs_or_with_an_unknown_framework(
    orch, write_file, text, says
):
    ran = orch("submit", write_file("job.toml", f'name = "j"\ngpus = 0\n{text}')).assert_failed(2)
    assert says in ran.err


def test_an_unsupported_transformers_is_refused_at_submit_in_one_line(orch, write_file, old_transformers):
    job = write_file(
        "job.toml",
        f'name = "j"\ngpus = 0\ninstrument = "transformers"\ncommand = ["{old_transformers}/bin/python", "train.py"]\n',
    )
    ran = orch("submit", job).assert_failed(2)
    lines = [line for line in ran.err.splitlines() if "instrument" in line]
    assert len(lines) == 1 and "transformers 4.20.0 is not one orch's instrument supports" in lines[0], ran.err


def test_a_missing_framework_is_refused_at_submit_but_auto_accepts_a_python_with_neither(orch, write_file, tmp_path):
    bare = tmp_path / "bare"
    venv.create(bare, with_pip=False, symlinks=True)
    command = f'command = ["{bare}/bin/python", "-c", "pass"]\n'
    ran = orch("submit", write_file("a.toml", f'name = "a"\ngpus = 0\ninstrument = "lightning"\n{command}'))
    assert "has no pytorch-lightning installed" in ran.assert_failed(2).err
    orch("submit", write_file("b.toml", f'name = "b"\ngpus = 0\ninstrument = "auto"\n{command}')).assert_ok()


def test_the_job_itself_refuses_an_unsupported_version_with_one_line_and_exit_78(tmp_path, old_transformers):
    program = write(tmp_path, "train.py", "from transformers.trainer import Trainer\nprint('trained')\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_") and k != "PYTHONPATH"}
    env.update({ENV_RUN_DIR: str(run_dir), ENV_ATTEMPT: "1"})
    env.update(instrument_env("auto", env))
    ran = run([str(old_transformers / "bin" / "python"), str(program)], env, tmp_path)
    assert ran.returncode == 78, ran
    assert "Traceback" not in ran.stderr and "trained" not in ran.stdout, ran.stderr
    assert "transformers 4.20.0 is not one orch's instrument supports" in ran.stderr
    assert "transformers 4.20.0" in json.loads((run_dir / "job_error.json").read_text())["message"]


def test_the_interpreter_is_read_from_a_console_scripts_first_line(tmp_path):
    script = write(tmp_path / "bin", "llamafactory-cli", f"#!{tmp_path}/venv/bin/python3.11\nimport sys\n")
    script.chmod(0o755)
    assert job_python(["llamafactory-cli", "train", "x.yaml"], None, {"PATH": str(tmp_path / "bin")}) == (
        f"{tmp_path}/venv/bin/python3.11"
    )
    shell = write(tmp_path / "bin", "run.sh", "#!/bin/bash\npython train.py\n")
    shell.chmod(0o755)
    assert job_python(["run.sh"], None, {"PATH": str(tmp_path / "bin")}) is None
    assert job_python([sys.executable, "t.py"], None, {}) == sys.executable


def test_a_users_own_sitecustomize_still_runs_and_a_program_importing_neither_is_left_alone(tmp_path):
    own = tmp_path / "own"
    write(own, "sitecustomize.py", "import os\nos.environ['USER_SITECUSTOMIZE'] = 'ran'\n")
    program = write(tmp_path, "plain.py", NEITHER + "import os\nprint(os.environ.get('USER_SITECUSTOMIZE'))\n")
    env = base_env()
    env["PYTHONPATH"] = os.pathsep.join([str(own), env["PYTHONPATH"]])
    plain = run([sys.executable, str(program), "a", "b"], env, tmp_path)
    env.update(instrument_env("auto", env))
    assert env["PYTHONPATH"].split(os.pathsep)[:2] == [str(boot_dir()), str(own)]
    instrumented = run([sys.executable, str(program), "a", "b"], env, tmp_path)
    assert plain.returncode == instrumented.returncode == 0, (plain, instrumented)
    assert instrumented.stdout == plain.stdout, (plain.stdout, instrumented.stdout)
    assert json.loads(instrumented.stdout.splitlines()[0]) == {"argv": ["a", "b"], "modules": []}
    assert instrumented.stdout.splitlines()[1] == "ran"
    assert instrumented.stderr == plain.stderr == ""


def _trainer_folder(output: Path, step: int, *, whole: bool = True) -> Path:
    folder = output / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"weights")
    if whole:  # the Trainer writes trainer_state.json last
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return folder


def test_the_resume_point_is_the_newest_whole_checkpoint_of_orch_or_of_the_program(tmp_path, monkeypatch):
    from training.instrument.hf_patch import resume_point

    output, ckpts = tmp_path / "out", tmp_path / "run" / "checkpoints"
    ckpts.mkdir(parents=True)
    linked = _trainer_folder(output, 30)
    os.symlink(os.path.relpath(linked, ckpts), ckpts / periodic_name(30))
    _trainer_folder(output, 45)  # saved, then a SIGKILL before orch's link
    _trainer_folder(output, 60, whole=False)  # torn by the SIGKILL
    monkeypatch.setenv(ENV_CKPT_DIR, str(ckpts))
    monkeypatch.setenv(ENV_RESUME_FROM, str(ckpts / periodic_name(30)))
    monkeypatch.setenv(ENV_ATTEMPT, "2")
    assert resume_point(str(output)) == str(output / "checkpoint-45")
    monkeypatch.setenv(ENV_ATTEMPT, "1")  # a first attempt never takes an output_dir's leftovers
    monkeypatch.delenv(ENV_RESUME_FROM)
    assert resume_point(str(output)) == str(ckpts / periodic_name(30))


def test_a_lightning_resume_takes_the_newest_loadable_ckpt_and_skips_a_torn_one(tmp_path, monkeypatch):
    import zipfile

    from training.instrument.lightning_patch import resume_point

    class Trainer:  # what resume_point reads of a Trainer: its ModelCheckpoint folders
        checkpoint_callbacks = [type("ModelCheckpoint", (), {"dirpath": str(tmp_path / "ckpts")})()]
        default_root_dir = str(tmp_path)

    (tmp_path / "ckpts").mkdir()
    ckpts = tmp_path / "run" / "checkpoints"
    ckpts.mkdir(parents=True)
    notice = ckpts / "notice-step-00000010.ckpt"
    for path in (notice, tmp_path / "ckpts" / "epoch=0-step=30.ckpt"):
        with zipfile.ZipFile(path, "w") as archive:  # torch.save's layout: a zip with data.pkl
            archive.writestr("archive/data.pkl", b"x")
    torn = tmp_path / "ckpts" / "epoch=0-step=45.ckpt"
    torn.write_bytes((tmp_path / "ckpts" / "epoch=0-step=30.ckpt").read_bytes()[:20])  # cut short by a SIGKILL
    os.utime(notice, (1, 1))
    os.utime(tmp_path / "ckpts" / "epoch=0-step=30.ckpt", (2, 2))
    monkeypatch.setenv(ENV_CKPT_DIR, str(ckpts))
    monkeypatch.setenv(ENV_RESUME_FROM, str(notice))
    monkeypatch.setenv(ENV_ATTEMPT, "3")
    assert resume_point(Trainer()) == str(tmp_path / "ckpts" / "epoch=0-step=30.ckpt")
    monkeypatch.setenv(ENV_ATTEMPT, "1")
    assert resume_point(Trainer()) == str(notice)
