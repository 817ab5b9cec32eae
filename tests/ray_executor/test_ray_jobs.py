"""Command jobs through a real orch daemon on a real Ray cluster (a head and two 1-GPU workers on
this host): each attempt is one Ray job on a GPU node, two run at once and a third waits in Ray for
a GPU; `orch cancel` stops a running one with its SIGTERM and a pending one before it runs; bad
input is said clearly (an unreachable head, more GPUs than any node has, a Ray Client address) and
the daemon needs no `ray` package at all."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from pathlib import Path

from conftest import ray_state, submit, wait_ray_state
from daemon_harness import wait_for
from orchestrator.model.states import AttemptOutcome, JobState

REPO = Path(__file__).resolve().parents[2]


def test_two_one_gpu_jobs_run_at_once_on_the_two_workers_and_a_third_waits_in_orchs_queue_for_a_free_gpu(ray_home):
    h = ray_home()
    with open(h.root / "config.toml", "a") as f:
        f.write('\n[pricing]\ncurrency = "USD"\ngpu_hour = 3600.0\n')  # one dollar a GPU-second
    h.start_daemon()
    jobs = [submit(h, h.job_file(name, gpus=1, hold="go", on_term=75)) for name in ("a", "b", "c")]
    started = [h.wait_record(name, "start", timeout=90) for name in ("a", "b")]
    assert all(r["env"]["CUDA_VISIBLE_DEVICES"] == "0" for r in started), started  # Ray's GPU of the node
    assert {r["env"]["ORCH_ATTEMPT"] for r in started} == {"1"}
    refs = [wait_ray_state(h, j, "RUNNING") for j in jobs[:2]]
    assert refs[0]["node_id"] != refs[1]["node_id"], refs  # one on each worker
    # The cluster's 2 GPUs are taken: the third waits in orch's queue, never submitted to Ray.
    full = "waiting for a free GPU on the Ray cluster (2 of 2 in use)"
    wait_for(lambda: h.job(jobs[2]).reason == full, 30, what=lambda: f"c to wait for a GPU: {h.job(jobs[2])}")
    assert h.state(jobs[2]) is JobState.QUEUED and h.job(jobs[2]).attempt == 0
    assert h.ray._get(f"/api/jobs/orch-{h.job(jobs[2]).uid}-1") is None  # Ray never heard of it
    assert h.records("c", "start") == []
    shown = h.cli("status")
    assert full in shown.stdout and "RUNNING on node" in shown.stdout, shown.stdout
    rows = {r["id"]: r for r in h.cli_json("status")}
    for j, ref in zip(jobs[:2], refs):  # `orch status --json` names the submission id and the node
        assert rows[j]["ray"] == {"submission_id": ref["submission_id"], "state": "RUNNING", "node_id": ref["node_id"]}
    h.release("go")
    for j in jobs:
        done = h.wait_state(j, JobState.SUCCEEDED, timeout=120)
        assert done.executor == "ray" and done.attempt == 1
    for j, ref in zip(jobs[:2], refs):  # after it ended, `orch show` still names its Ray job and node
        ray = h.cli_json("show", str(j))["attempts"][0]["ray"]
        assert ray["submission_id"] == ref["submission_id"] and ray["node_id"] == ref["node_id"], (ray, ref)
        assert f"Ray {ref['submission_id']} on node {ref['node_id'][:8]}" in h.cli("show", str(j)).stdout
    log = (h.run_dir(jobs[0]) / "attempt-1.log").read_text()
    assert "a#1 says hello on stdout" in log and "a#1 says hello on stderr" in log, log  # written on the node
    assert h.exit_record(jobs[0], 1)["code"] == 0
    bill = h.cli_json("cost")  # charged by allocation: while Ray ran it, its GPU x gpu_hour; no idle
    charged = {j["id"]: j for j in bill["jobs"]}
    for j in jobs:  # c may end before a poll sees it RUNNING: then it cost nothing, and held no GPU-hour
        assert abs(charged[j]["cost"] - charged[j]["gpu_hours"] * 3600.0) < 0.05, charged[j]
    assert charged[jobs[0]]["cost"] > 0 and charged[jobs[1]]["cost"] > 0, charged  # held while released
    assert bill["idle_cost"] == 0, bill


def test_cancel_stops_a_running_job_with_sigterm_and_a_pending_one_before_it_runs(ray_home):
    h = ray_home(autoscaler=True)  # the cluster "grows on demand": the third is submitted, PENDING in Ray
    h.start_daemon()
    running = [submit(h, h.job_file(name, gpus=1, hold="never", on_term=75)) for name in ("r1", "r2")]
    pending = submit(h, h.job_file("p", gpus=1, hold="never"))
    for name in ("r1", "r2"):
        h.wait_record(name, "start", timeout=90)
    wait_ray_state(h, pending, "PENDING")
    assert h.cli("cancel", str(pending)).returncode == 0
    gone = h.wait_state(pending, JobState.CANCELLED, timeout=60)
    assert h.records("p", "start") == [] and gone.attempt == 1
    assert "stopped while pending in Ray" in (h.run_dir(pending) / "attempt-1.log").read_text()
    assert h.cli("cancel", str(running[0])).returncode == 0
    h.wait_record("r1", "sigterm", timeout=60)  # the job heard Ray's stop as orch's "checkpoint now"
    done = h.wait_state(running[0], JobState.CANCELLED, timeout=60)
    assert h.exit_record(running[0], 1)["code"] == 75, h.exit_record(running[0], 1)
    assert done.reason.startswith("cancelled by the user"), done.reason
    assert h.cli("cancel", str(running[1])).returncode == 0
    h.wait_state(running[1], JobState.CANCELLED, timeout=60)


def test_more_gpus_than_any_node_has_fails_at_its_start_with_the_reason(ray_home):
    h = ray_home()
    h.start_daemon()
    job = submit(h, h.job_file("big", gpus=2, retries=2))
    done = h.wait_state(job, JobState.FAILED, timeout=60)
    assert "asks for 2 GPUs on one node" in done.reason and "largest node" in done.reason, done.reason
    assert done.attempt == 1  # a mistake, not a bad machine: never retried
    shown = h.cli("status", "--all")
    assert "largest node" in shown.stdout, shown.stdout


def test_an_unreachable_head_is_said_in_status_and_nothing_is_lost(ray_home, request):
    held = socket.socket()  # bound, never listened on, held until the test ends: refused, never taken
    held.bind(("127.0.0.1", 0))
    request.addfinalizer(held.close)
    nobody = held.getsockname()[1]
    h = ray_home(address=f"http://127.0.0.1:{nobody}")
    h.start_daemon()
    job = submit(h, h.job_file("lonely", gpus=1))
    # It cannot tell whether a GPU is free: the job waits in orch's queue, and says why.
    wait_for(lambda: "waiting for the Ray head" in h.job(job).reason, 30, what=lambda: str(h.job(job)))
    shown = h.cli("status")
    assert "does not answer" in shown.stdout and f"127.0.0.1:{nobody}" in shown.stdout, shown.stdout
    assert h.state(job) is JobState.QUEUED and h.job(job).attempt == 0
    assert h.cli("cancel", str(job)).returncode == 0
    h.wait_state(job, JobState.CANCELLED, timeout=30)
    assert h.store.attempts(job) == []
    # With the autoscaler (no free-GPU count to wait for) the attempt starts and its submit
    # waits in the daemon until the head answers.
    h = ray_home(address=f"http://127.0.0.1:{nobody}", autoscaler=True)
    h.start_daemon()
    job = submit(h, h.job_file("lonely", gpus=1))
    wait_for(lambda: ray_state(h, job) == "UNSUBMITTED", 30, what=lambda: str(h.job(job).executor_ref))
    # The submit is queued under the tick's lock and sent by the exchange off it: the head's silence
    # reaches `orch status` once an exchange has tried it.
    wait_for(lambda: f"127.0.0.1:{nobody}" in h.cli("status").stdout, 30, what=lambda: h.cli("status").stdout)
    shown = h.cli("status")
    assert "not submitted yet" in shown.stdout and f"127.0.0.1:{nobody}" in shown.stdout, shown.stdout
    wait_for(lambda: "does not answer" in h.log_text(), 30, what="the daemon to log that the head does not answer")
    assert h.state(job) is JobState.RUNNING and h.job(job).attempt == 1
    assert h.cli("cancel", str(job)).returncode == 0
    h.wait_state(job, JobState.CANCELLED, timeout=30)
    assert [a.outcome for a in h.store.attempts(job)] == [AttemptOutcome.CANCELLED]


def test_a_ray_client_address_is_refused_with_what_to_write_instead(ray_home):
    h = ray_home()
    path = h.root / "config.toml"
    path.write_text(path.read_text().replace(f'address = "{h.ray.address}"', 'address = "ray://head:10001"'))
    out = h.cli("config", "check", str(path))
    assert out.returncode == 2, out
    assert "ray.address" in out.stderr and "http://HEAD:8265" in out.stderr and "Traceback" not in out.stderr


def test_the_daemon_runs_ray_jobs_without_the_ray_package(ray_home):
    """orch speaks Ray's Jobs REST API: a daemon whose Python cannot import `ray` runs a job."""
    h = ray_home()
    job = submit(h, h.job_file("plain", gpus=1))
    script = (
        "import sys, time\n"
        "sys.modules['ray'] = None  # `import ray` raises ImportError from here on\n"
        "from orchestrator.daemon.tick import Daemon\n"
        "from pathlib import Path\n"
        "from orchestrator.home.paths import Home\n"
        "from orchestrator.spec.config import load_config\n"
        "from orchestrator.store import Store\n"
        f"home = Home(Path({str(h.root)!r}))\n"
        "d = Daemon(home, load_config(home.root / 'config.toml'), Store(home.db))\n"
        "d.recover(time.time())\n"
        "end = time.time() + 90\n"
        f"while d.store.get({job}).state.value != 'succeeded' and time.time() < end:\n"
        "    d.tick(); time.sleep(0.2)\n"
        f"print(d.store.get({job}).state.value, 'ray' in sys.modules and sys.modules['ray'] is not None)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**h.env(), "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")},
    )
    assert out.stdout.split() == ["succeeded", "False"], out.stdout + out.stderr[-3000:]


def test_doctor_checks_that_a_job_on_a_gpu_worker_sees_the_run_folders(ray_home):
    h = ray_home()
    out = h.cli("doctor", timeout=180)
    line = next((x for x in out.stdout.splitlines() if " ray " in x), "")
    assert line.startswith("ok") and "is shared with the Ray nodes" in line, out.stdout
    assert not list(h.home.runs.glob(".doctor-*"))  # the probe's files are cleaned up
