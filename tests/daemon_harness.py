"""A real daemon in a temp $ORCH_HOME, real command jobs, and polling helpers for the daemon tests.

The jobs are one small script (tests/fake_job.py) driven by a JSON behaviour: record start/end to a
shared jsonl file, wait for a release file, trap SIGTERM, write a checkpoint, exit with a code —
each optionally per attempt. Tests read the outcome from the real SQLite store and run folder.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

import pytest
import tomli_w

from orchestrator.spec.config import load_config
from orchestrator.host.gpus import managed_gpus
from orchestrator.jobs.lifecycle import submit_job
from orchestrator.home.paths import Home
from orchestrator.host.polling import poll
from orchestrator.contract import read_json
from orchestrator.host.procs import is_alive, session_members, start_time  # noqa: F401  (session_members: re-exported)
from orchestrator.model.records import Job
from orchestrator.model.states import JobState
from orchestrator.store import Store
from orchestrator.home.wake import poke

if TYPE_CHECKING:
    from orchestrator.daemon.tick import Daemon

JOB_SCRIPT = Path(__file__).with_name("fake_job.py")  # the job every daemon test runs


def wait_for(
    predicate: Callable[[], Any],
    timeout: float = 15.0,
    what: "str | Callable[[], str]" = "",
    interval: float = 0.05,
) -> Any:
    """Poll until `predicate()` is truthy and return its value; fail the test after `timeout`.
    `what` may be a callable: it is called at the timeout, so the message tells the state then."""
    value = poll(predicate, timeout, interval)
    if not value:
        text = what() if callable(what) else what
        raise AssertionError(f"timed out after {timeout:g}s waiting for {text or predicate}")
    return value


class OrchHome:
    """One $ORCH_HOME with its config, jobs, daemons and helpers."""

    def __init__(self, tmp: Path, config: Optional[dict[str, Any]] = None, *, gpus_on_cpu: bool = False, **daemon: Any):
        self.tmp = tmp
        # The listed [daemon] gpus are slots on this CPU machine: ORCH_GPUS_ON_CPU=1 for the daemon,
        # `orch run` and the jobs, without which a job is refused GPUs nvidia-smi does not show.
        self.gpus_on_cpu = gpus_on_cpu
        self.root = tmp / "home"
        self.home = Home(self.root).ensure()
        self.script = tmp / "job.py"
        self.script.write_text(JOB_SCRIPT.read_text())
        self.jobs_dir = tmp / "jobs"
        self.jobs_dir.mkdir()
        self.daemons: list[subprocess.Popen] = []
        self.extra_pids: list[tuple[int, Optional[str]]] = []
        self.configure(config, **daemon)
        self.store = Store(self.home.db)

    # -- config and jobs -----------------------------------------------------------------

    def configure(self, config: Optional[dict[str, Any]] = None, **daemon: Any) -> None:
        """Write config.toml: `config` as a whole (any sections), its [daemon] on top of the
        harness's fast defaults, and `daemon` keys on top of that."""
        cfg = json.loads(json.dumps(config or {}))
        cfg["daemon"] = {
            "tick_seconds": 0.5,
            "grace_seconds": 3,
            "retry_backoff_seconds": 0.2,
            "gpus": [],
            "warm_preflight": False,  # torch imported beside every test daemon: only its own tests want it
            **cfg.get("daemon", {}),
            **daemon,
        }
        (self.root / "config.toml").write_text(tomli_w.dumps(cfg))
        self.config = load_config(self.root / "config.toml", required=True)

    def job_file(
        self,
        name: str,
        *,
        gpus: int = 0,
        retries: int = 0,
        priority: Optional[int] = None,
        env: Optional[dict[str, str]] = None,
        grace_seconds: Optional[float] = None,
        command: Optional[list[str]] = None,
        **behaviour: Any,
    ) -> Path:
        behaviour = {"name": name, "dir": str(self.tmp), **behaviour}
        if env:
            behaviour.setdefault("env_keys", list(env))
        lines = [
            f"name = {json.dumps(name)}",
            f"gpus = {gpus}",
            f"retries = {retries}",
            f"command = {json.dumps(command or [sys.executable, str(self.script), json.dumps(behaviour)])}",
        ]
        if priority is not None:
            lines.append(f"priority = {priority}")
        if grace_seconds is not None:
            lines.append(f"grace_seconds = {grace_seconds}")
        if env:
            lines.append("[env]")
            lines += [f"{k} = {json.dumps(v)}" for k, v in env.items()]
        path = self.jobs_dir / f"{name}.toml"
        path.write_text("\n".join(lines) + "\n")
        return path

    def submit(
        self,
        job: str | Path,
        *,
        priority: Optional[int] = None,
        after: tuple[int, ...] = (),
        not_before: Optional[float] = None,
        **behaviour: Any,
    ) -> int:
        """What `orch submit` does, in-process (a CLI process costs ~0.4 s of CPU): the real
        submit_job on the real store, then a poke on the wake socket. `job` is a job file, or the
        name of a JOB_SCRIPT job made with `behaviour`."""
        path = job if isinstance(job, Path) else self.job_file(job, **behaviour)
        submitted = submit_job(
            self.store,
            self.config,
            self.home,
            path,
            now=time.time(),
            priority=priority,
            after=after,
            not_before=not_before,
            machine_gpus=len(managed_gpus(self.config.daemon.gpus)),
        )
        poke(self.home.wake_socket)
        return submitted.id

    def release(self, key: str) -> None:
        (self.tmp / f"release-{key}").touch()

    # -- looking -------------------------------------------------------------------------

    def job(self, job_id: int) -> Job:
        return self.store.get(job_id)

    def state(self, job_id: int) -> JobState:
        return self.store.get(job_id).state

    def wait_state(self, job_id: int, *states: JobState, timeout: float = 30.0) -> Job:
        wait_for(
            lambda: self.state(job_id) in states,
            timeout,
            what=lambda: (
                f"job {job_id} to become {'/'.join(s.value for s in states)} (at the timeout it is "
                f"{self.state(job_id).value}; daemon log tail:\n{self.log_tail(40)}{self.diagnostics(job_id)})"
            ),
        )
        return self.job(job_id)

    def diagnostics(self, job_id: int) -> str:
        """More to print when a wait times out: the tails of the job's attempt logs (a Slurm
        home adds what Slurm says)."""
        out = []
        for log in sorted(self.run_dir(job_id).glob("attempt-*.log")):
            lines = log.read_text(errors="replace").splitlines()[-15:]
            out.append(f"\n--- {log.name} (tail) ---\n" + "\n".join(lines))
        return "".join(out)

    def records(self, name: Optional[str] = None, event: Optional[str] = None) -> list[dict[str, Any]]:
        path = self.tmp / "record.jsonl"
        if not path.exists():
            return []
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return [r for r in rows if (name is None or r["name"] == name) and (event is None or r["event"] == event)]

    def wait_record(
        self, name: str, event: str = "start", attempt: Optional[int] = None, timeout: float = 20.0
    ) -> dict[str, Any]:
        def found() -> Optional[dict[str, Any]]:
            rows = [r for r in self.records(name, event) if attempt is None or r["attempt"] == attempt]
            return rows[-1] if rows else None

        return wait_for(found, timeout, what=f"{name} to record {event!r} (attempt {attempt})")

    def event_kinds(self, job_id: int) -> list[str]:
        return [e.kind for e in self.store.events(job_id)]

    def run_dir(self, job_id: int) -> Path:
        return self.home.run_dir(job_id)

    def exit_record(self, job_id: int, attempt: int) -> Optional[dict[str, Any]]:
        return read_json(self.run_dir(job_id) / f"attempt-{attempt}.exit")

    def log_tail(self, n: int = 15) -> str:
        try:
            return "\n".join(self.home.log_file.read_text().splitlines()[-n:])
        except OSError:
            return ""

    # -- the CLI and the daemon ----------------------------------------------------------

    def env(self) -> dict[str, str]:
        """The environment for the CLI and the daemon: offline, one thread, no outside home."""
        env = dict(os.environ)
        env.update(
            {
                "HF_HUB_OFFLINE": "1",
                "HF_DATASETS_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                "TOKENIZERS_PARALLELISM": "false",
                "OMP_NUM_THREADS": "1",
            }
        )
        env.pop("ORCH_HOME", None)
        env.pop("ORCH_CONFIG", None)
        if self.gpus_on_cpu:
            env["ORCH_GPUS_ON_CPU"] = "1"
        return env

    def cli(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "--home", str(self.root), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            env=self.env(),
        )

    def cli_json(self, *args: str) -> Any:
        out = self.cli(*args, "--json")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    def local_daemon(self) -> "Daemon":
        """The daemon's steps in this process, with real supervisors and jobs: a test calls
        `tick()` itself, so "nothing happens for a few ticks" needs no fixed sleep."""
        from orchestrator.daemon.tick import Daemon

        d = Daemon(self.home, self.config, self.store, environ=self.env())
        d.recover(time.time())
        return d

    def tick_until(
        self, d: "Daemon", predicate: Callable[[], Any], timeout: float = 30.0, what: "str | Callable[[], str]" = ""
    ) -> Any:
        """Tick `d` until `predicate` holds (what the daemon's loop does, without its clock)."""

        def ticked() -> Any:
            d.tick()
            return predicate()

        return wait_for(ticked, timeout, what=what, interval=0.1)

    def tick_state(self, d: "Daemon", job_id: int, *states: JobState, timeout: float = 60.0) -> Job:
        """Tick `d` until the job is in one of `states` (wait_state for an in-process daemon)."""
        self.tick_until(
            d,
            lambda: self.state(job_id) in states,
            timeout,
            what=lambda: f"job {job_id} to become {'/'.join(s.value for s in states)}{self.diagnostics(job_id)}",
        )
        return self.job(job_id)

    def wait_ticks(self, ticks: int = 3, *, timeout: float = 60.0, **passes: int) -> dict[str, int]:
        """Wait until the running daemon has done `ticks` more ticks than now, and as many more
        passes of the others it counts as asked (`exchanges`: executor exchanges, each a look at a
        cluster when one is due; `notices`: polls of every preemption source; `outbox`: deliveries;
        `mirror`: the uploader's passes), as it says on its wake socket: what a test observes
        before asserting that nothing happened meanwhile, instead of sleeping a guessed time that a
        stalled machine may not fill. A thread's pass under way when asked is not counted (it may
        have looked before the change the test made)."""
        from orchestrator.home.wake import counters

        want = {"ticks": ticks, **passes}
        before = wait_for(lambda: counters(self.home.wake_socket), timeout, what="the daemon's counters")
        missing = sorted(set(want) - set(before))
        assert not missing, f"the daemon counts no {missing} (it counts {sorted(before)})"
        return wait_for(
            lambda: (
                (now := counters(self.home.wake_socket))
                and all(now[k] >= before[k] + n + (1 if n and k != "ticks" else 0) for k, n in want.items())
                and now
            ),
            timeout,
            what=f"the daemon's counters to grow by {want}",
        )

    def start_daemon(self, timeout: float = 20.0) -> subprocess.Popen:
        """`orch --home H daemon run` as a subprocess; returns once it has recovered and ticks."""
        before = self._started_count()
        out = open(self.tmp / f"daemon-{len(self.daemons) + 1}.out", "wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", "--home", str(self.root), "daemon", "run"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=self.env(),
        )
        out.close()
        self.daemons.append(proc)
        wait_for(lambda: self._started_count() > before or proc.poll() is not None, timeout, what="the daemon to start")
        assert proc.poll() is None, f"the daemon exited at start: {self.daemon_output(proc)}"
        return proc

    def _started_count(self) -> int:
        return self.log_text().count("daemon started")

    def log_text(self) -> str:
        try:
            return self.home.log_file.read_text()
        except OSError:
            return ""

    def daemon_output(self, proc: subprocess.Popen) -> str:
        idx = self.daemons.index(proc) + 1
        return (self.tmp / f"daemon-{idx}.out").read_text(errors="replace")

    def stop_daemon(self, proc: subprocess.Popen, timeout: float = 20.0) -> int:
        proc.send_signal(signal.SIGTERM)
        return proc.wait(timeout)

    def kill9(self, proc: subprocess.Popen) -> None:
        proc.kill()
        proc.wait(5)

    def attempt_pids(self, job_id: int, attempt: int) -> dict[str, Any]:
        return wait_for(
            lambda: read_json(self.run_dir(job_id) / f"attempt-{attempt}.pid"),
            10,
            what=f"attempt-{attempt}.pid of job {job_id}",
        )

    # -- teardown ------------------------------------------------------------------------

    def cleanup(self) -> None:
        """Stop every daemon (ours and any `daemon start` left), then kill whatever job or
        supervisor still lives, identified by pid and start time from attempt-<n>.pid."""
        from orchestrator.home.daemon_lock import running_pid

        for proc in self.daemons:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.daemons:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        detached = running_pid(self.home)
        if detached and detached > 0:
            started = start_time(detached)
            os.kill(detached, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while is_alive(detached, started) and time.monotonic() < deadline:
                time.sleep(0.05)
            if is_alive(detached, started):
                os.kill(detached, signal.SIGKILL)
        kill_leftover_attempts(self.home)
        self.store.close()


def kill_leftover_attempts(home: Home) -> None:
    """SIGKILL any job or supervisor still alive in `home`, identified by pid and start time from
    attempt-<n>.pid: a failed test must not leave training processes behind. The supervisor goes
    first: as on a machine that is gone, nothing is left to write the job's exit record (killed
    second, it could record the job's SIGKILL, an ending instead of a lost attempt)."""
    for pid_file in home.runs.glob("*/attempt-*.pid"):
        info = read_json(pid_file) or {}
        for key in ("supervisor", "job"):
            pid, started = info.get(f"{key}_pid"), info.get(f"{key}_start")
            if pid and is_alive(pid, started):
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    pass


@pytest.fixture
def orch_home(tmp_path: Path) -> Iterator[Callable[..., OrchHome]]:
    """A factory: `orch_home(cpu_slots=2, gpus=[0, 1])` gives an OrchHome with that [daemon] config
    (`gpus_on_cpu=True`: those GPU slots rehearsed on this CPU machine); every daemon and leftover
    process is stopped at teardown."""
    made: list[OrchHome] = []

    def make(**daemon: Any) -> OrchHome:
        folder = tmp_path / f"h{len(made)}"
        folder.mkdir()
        h = OrchHome(folder, **daemon)
        made.append(h)
        return h

    yield make
    for h in made:
        h.cleanup()


def running_in_group(pgid: int) -> list[int]:
    """Processes of group `pgid` still running (a zombie waiting for a reaper is not running: in a
    container whose init does not reap, one stays listed)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = open(f"/proc/{entry}/stat").read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(entry))
    return out
