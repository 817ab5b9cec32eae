"""`orch estimate` and `orch submit --estimate` with the real CLI: a real probe of a tiny built-in
job (a subprocess of the training package: the CLI process itself never imports torch), a command
job estimated from its name's history or plainly not (these and the sweep cases through the same app
in-process: nothing is probed there), and no probe touching the store's jobs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w
import tomllib

pytestmark = pytest.mark.slow

HEAVY = ("torch", "lightning", "pytorch_lightning", "transformers", "datasets")
IN_PROCESS = """
import json, sys
from orchestrator.cli.app import main
sys.argv = ["orch", "estimate", sys.argv[1], "--json", "--warmup", "3", "--steps", "6"]
try:
    main()
except SystemExit as exc:
    assert not exc.code, exc.code
heavy = sorted(m for m in sys.modules if m.split(".")[0] in %r)
sys.stderr.write("HEAVY=" + json.dumps(heavy) + "\\n")
""" % (HEAVY,)


@pytest.fixture(scope="module")
def builtin_job(tmp_path_factory) -> Path:
    from training.toy import build_tiny_bert, sentiment_rows, write_jsonl

    root = tmp_path_factory.mktemp("estimate")
    texts = [r["text"] for r in sentiment_rows(500, seed=1)]
    model = build_tiny_bert(root / "tiny-bert", texts, hidden=32, layers=2, heads=2, vocab_size=300, max_positions=64)
    spec = {
        "name": "tiny",
        "gpus": 0,
        "model": {"name_or_path": str(model), "num_labels": 2},
        "data": {
            "train": str(write_jsonl(root / "train.jsonl", sentiment_rows(320, seed=11))),
            "validation": str(write_jsonl(root / "dev.jsonl", sentiment_rows(64, seed=12))),
            "max_length": 32,
            "num_workers": 0,
        },
        "train": {"max_epochs": 2, "batch_size": 16, "precision": "32"},
        "checkpoint": {"every_n_steps": 25},
        "env": {"HF_DATASETS_CACHE": str(root / "hf-cache")},
    }
    path = root / "tiny.toml"
    path.write_bytes(tomli_w.dumps(spec).encode())
    return path


def offline(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env.update(
        {
            "ORCH_HOME": str(home),
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": "1",
        }
    )
    return env


def test_estimate_of_a_builtin_job_probes_it_and_the_cli_never_imports_torch(home, builtin_job, job_count, write_file):
    # Named as usual, `cd project && orch estimate job.toml`: the probe (a subprocess in another
    # folder) was once handed the relative name and failed with a traceback.
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text('[pricing]\ncurrency = "CNY"\ninstance_hour = 3.6\n')
    proc = subprocess.run(
        [sys.executable, "-c", IN_PROCESS, builtin_job.name],
        capture_output=True,
        text=True,
        env={**offline(home), "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        cwd=builtin_job.parent,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (marker,) = [line for line in proc.stderr.splitlines() if line.startswith("HEAVY=")]
    assert json.loads(marker[len("HEAVY=") :]) == []
    d = json.loads(proc.stdout)
    assert d["kind"] == "builtin" and d["total_steps"] == 40 and d["steps_per_s"] > 0
    # the range, and what the probe saw of the load (Linux: /proc)
    assert d["wall_s_low"] <= d["wall_s"] <= d["wall_s_high"] and d["cost_low"] <= d["cost"] <= d["cost_high"]
    load = d["load"]
    assert load["cpus"] >= 1 and load["threads"] == 1 and 0 < load["busy_cores"] <= load["cpus"] + 0.2, load
    assert load["others_in_probe"] >= 0 and load["others_high"] >= load["others_typical"] + 1, load
    assert "_probe" not in d
    assert d["probe"]["measured_steps"] >= 1 and d["probe"]["seconds"] > 0 and d["probe"]["cost"] > 0
    parts = d["parts_s"]
    assert parts["startup"] > 0 and parts["training"] > 0 and parts["eval"] > 0 and parts["checkpoint"] > 0
    assert d["wall_s"] == pytest.approx(sum(parts.values()), abs=0.5)
    assert d["cost"] == pytest.approx(d["wall_s"] / 3600 * 3.6, rel=0.01)
    assert d["evals"] == 2 and d["saves"] >= 1 and d["checkpoint_interval_why"]
    assert d["queue_wait_s"] == 0 and d["mtbf_source"].startswith("no preemption")
    assert job_count() == 0  # a probe is no job
    # what the process holds: 16 bytes per trained parameter (AdamW in float32), counted on the meta device
    from transformers import AutoModelForSequenceClassification

    spec = tomllib.loads(builtin_job.read_text())
    real = AutoModelForSequenceClassification.from_pretrained(spec["model"]["name_or_path"], num_labels=2)
    params = sum(p.numel() for p in real.parameters())
    memory = d["memory"]
    assert memory["params"] == params and memory["strategy"] == "one process" and d["ranks"] is None
    assert memory["state_bytes"] == 16 * params and memory["on_gpu_bytes"] == 16 * params
    assert memory["activation_bytes"] is None  # measured only on a GPU


def test_submit_with_estimate_asks_first_and_queues_only_on_yes(orch, home, builtin_job, job_count, write_file):
    # a built-in job of 6 steps (its probe runs all of them): the estimate, then the question
    body = builtin_job.read_text()
    assert "\n[train]\n" in body
    short = write_file("short.toml", body.replace("\n[train]\n", "\n[train]\nmax_steps = 6\n"))
    ran = orch("submit", short, "--estimate", env={"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}, timeout=600)
    assert ran.rc == 1 and "steps/s" in ran.err and "not queued" in ran.err, ran.err  # no tty: the answer is no
    assert job_count() == 0
    # --yes: the same estimate, then queued. After the estimate submit does the same whatever the
    # kind, so a command job shows it without paying for a second probe (a process of ~10-30 s).
    job = write_file("cmd.toml", 'name = "nightly"\ngpus = 0\ncommand = ["true"]\n')
    ran = orch("submit", job, "--estimate", "--yes", "--json")
    assert ran.rc == 0 and "cannot estimate" in ran.err, ran.err
    assert json.loads(ran.out)["state"] == "queued" and job_count() == 1


def test_a_command_job_is_estimated_from_its_names_history_or_not_at_all(cli, write_file, store):
    job = write_file("cmd.toml", 'name = "nightly"\ngpus = 0\ncommand = ["true"]\n')
    ran = cli("estimate", job)
    assert ran.rc == 0 and "cannot estimate" in ran.out and "nightly" in ran.out, ran.out + ran.err
    assert json.loads(cli("estimate", job, "--json").out)["wall_s"] is None
    # a finished job of that name: its run time and cost are the estimate
    cli("submit", job).assert_ok()
    (row,) = store.jobs()
    store.db.execute("UPDATE jobs SET state='succeeded', run_seconds=120, cost=0.5 WHERE id=?", (row.id,))
    store.db.commit()
    d = json.loads(cli("estimate", job, "--json").out)
    assert d["wall_s"] == 120 and d["history_runs"] == 1 and d["queue_wait_s"] == 0


def test_estimate_of_a_job_asking_for_more_gpus_than_here_is_refused_before_any_probe(orch, builtin_job, tmp_path):
    # It used to run a minute-long probe on the CPU, then say "starts: never on this machine".
    # and before the pre-flight (seconds of a subprocess): its rows have no 'text', which the
    # pre-flight would report first
    body = builtin_job.read_text().replace("gpus = 0", "gpus = 64")
    (tmp_path / "rows.jsonl").write_text('{"txt": "good", "label": 1}\n')
    body = re.sub(r'train = "[^"]*"', f'train = "{tmp_path / "rows.jsonl"}"', body)
    assert "rows.jsonl" in body
    job = tmp_path / "big.toml"
    job.write_text(body)
    ran = orch("estimate", job, timeout=120)
    assert ran.rc == 2, ran.out + ran.err
    assert f"{job}: gpus: asks for 64 GPUs" in ran.err and "Traceback" not in ran.err, ran.err
    assert ran.out == ""


def test_a_sweep_file_gets_its_base_jobs_estimate_and_the_bound_of_every_trial_run_out(cli, home, write_file, store):
    # It used to say "unknown key 'sweep'": the sweep file is what the user has in hand.
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text('[pricing]\ncurrency = "CNY"\ninstance_hour = 3.6\n')
    write_file("base.toml", 'name = "nightly"\ngpus = 0\ncommand = ["train", "--lr", "{lr}"]\n')
    sweep = write_file(
        "sweep.toml",
        '[sweep]\njob = "base.toml"\ntrials = 5\nparallel = 2\nobjective = "loss"\ndirection = "minimize"\n'
        "max_cost = 9.0\n\n[sweep.params]\nlr = { values = [0.1, 0.01, 0.001, 0.0001, 0.00001] }\n",
    )
    cli("submit", write_file("one.toml", 'name = "nightly"\ngpus = 0\ncommand = ["true"]\n')).assert_ok()
    (row,) = store.jobs()
    store.db.execute("UPDATE jobs SET state='succeeded', run_seconds=120, cost=0.5 WHERE id=?", (row.id,))
    store.db.commit()
    d = json.loads(cli("estimate", sweep, "--json").out)
    assert d["job"] == "nightly" and d["wall_s"] == 120 and d["cost"] == pytest.approx(0.12), d  # 120 s at 3.6/h
    # one CPU slot (the default): the trials run one at a time here, whatever `parallel` says
    # each trial at most the slowest run seen (120 s), and a tick of the daemon to start each wave
    assert d["sweep"] == {
        "trials": 5,
        "parallel": 2,
        "at_once_here": 1,
        "trial_wall_s_at_most": 120.0,
        "cost_at_most": 0.6,
        "wall_s_at_most": 605.0,
        "max_cost": 9.0,
    }
    text = cli("estimate", sweep).out
    assert "sweep of 5 trials, 1 at a time (parallel = 2, but this machine's slots run 1)" in text, text
    (home / "config.toml").write_text('[daemon]\ncpu_slots = 4\n[pricing]\ncurrency = "CNY"\ninstance_hour = 3.6\n')
    d = json.loads(cli("estimate", sweep, "--json").out)
    assert (d["sweep"]["at_once_here"], d["sweep"]["wall_s_at_most"]) == (2, 363.0), d["sweep"]
    # two CPU trials at once share the instance price: together at most 363 s of it
    assert d["sweep"]["cost_at_most"] == pytest.approx(0.363), d["sweep"]
    text = cli("estimate", sweep).out
    assert "sweep of 5 trials, 2 at a time, each like" in text and "6m" in text and "max_cost" in text, text
    # submit --estimate: the same bound, then a question; no terminal means no sweep
    ran = cli("submit", sweep, "--estimate")
    assert ran.rc == 1 and "sweep of 5 trials" in ran.err and "not queued" in ran.err, ran.err
    assert store.sweeps() == []
    ran = cli("submit", sweep, "--estimate", "--yes", "--json")
    assert ran.rc == 0 and json.loads(ran.out)["kind"] == "sweep", ran.err
    assert len(store.sweeps()) == 1
    # a bad sweep file is refused before anything is probed, naming the file and field
    bad = write_file("bad.toml", sweep.read_text().replace("trials = 5", "trials = 0"))
    ran = cli("estimate", bad)
    assert ran.rc == 2 and f"{bad}: sweep.trials" in ran.err and "Traceback" not in ran.err, ran.err
