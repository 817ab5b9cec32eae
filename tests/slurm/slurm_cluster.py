"""A private Slurm cluster in a temporary folder: munged, slurmctld and two slurmd ("n1", "n2") on
this one host, no systemd (the commands are the ones Debian's packages need), each with 1 CPU and two
fake "GPUs" (gres backed by /dev/null and /dev/zero: allocated and counted, never computed on).
Used by the Slurm tests' session fixture and by benchmarks/slurm.py.

Ports are picked free at start, so two clusters (a test run and a benchmark) do not collide.
Accounting is off (squeue/scontrol + jobcomp/filetxt) unless `accounting=True` and slurmdbd and
MariaDB are installed."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
NODES = ("n1", "n2")


def missing_programs() -> list[str]:
    wanted = ["/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged", "sbatch", "squeue", "scancel", "srun"]
    return [p for p in wanted if not (Path(p).exists() if p.startswith("/") else shutil.which(p))]


def why_no_accounting() -> Optional[str]:
    missing = [
        p
        for p in ("/usr/sbin/slurmdbd", "mariadbd", "mariadb-install-db", "mariadb")
        if not (Path(p).exists() if p.startswith("/") else shutil.which(p))
    ]
    if missing:
        return (
            f"Slurm accounting needs slurmdbd and MariaDB ({', '.join(missing)} missing): "
            "apt-get install slurmdbd mariadb-server"
        )
    return None


def why_unusable() -> Optional[str]:
    """None when a private cluster can be started here; else the reason (for pytest.skip)."""
    if os.geteuid() != 0:
        return "the private Slurm cluster needs root (SlurmUser=root, munged as the munge user)"
    missing = missing_programs()
    if missing:
        return (
            f"Slurm is not installed ({', '.join(missing)} missing): run scripts/system-deps.sh "
            f"(Debian packages {' '.join(PACKAGES)})"
        )
    if not Path("/etc/munge/munge.key").exists():
        return "/etc/munge/munge.key is missing (reinstall the munge package)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SLURM_CONF = """\
ClusterName=orchtest
SlurmctldHost={host}
SlurmUser=root
SlurmctldPort={ctld_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={base}/munge/munge.socket.2,cred_expire=10
StateSaveLocation={base}/state
SlurmdSpoolDir={base}/spool/slurmd-%n
SlurmctldPidFile={base}/slurmctld.pid
SlurmdPidFile={base}/slurmd-%n.pid
SlurmctldLogFile={base}/log/slurmctld.log
SlurmdLogFile={base}/log/slurmd-%n.log
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=1
MpiDefault=none
GresTypes=gpu
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
{accounting}
JobCompType=jobcomp/filetxt
JobCompLoc={base}/log/jobcomp.txt
SlurmdTimeout=10
JobRequeue=1
ReturnToService=2
KillWait=5
MinJobAge={min_job_age}
InactiveLimit=0
NodeName=n1 NodeHostname={host} NodeAddr=127.0.0.1 Port={n1_port} CPUs=1 RealMemory=1000 Gres=gpu:2 State=UNKNOWN
NodeName=n2 NodeHostname={host} NodeAddr=127.0.0.1 Port={n2_port} CPUs=1 RealMemory=1000 Gres=gpu:2 State=UNKNOWN
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
PartitionName=low Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime={grace}
PartitionName=high Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF
"""


class SlurmCluster:
    """start() / stop(); `env` is what every Slurm client command needs (SLURM_CONF)."""

    def __init__(
        self, base: Optional[Path] = None, *, grace: int = 15, min_job_age: int = 600, accounting: bool = False
    ):
        self.base = Path(base or tempfile.mkdtemp(prefix="orch-slurm-"))
        self.grace = grace
        self.min_job_age = min_job_age
        self.accounting = accounting  # slurmdbd + a private MariaDB (slurm-facts.md)
        self.conf = self.base / "etc" / "slurm.conf"
        self.procs: dict[str, subprocess.Popen] = {}
        self.munged_pid: Optional[int] = None

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        # cwd: an sbatch without -o writes slurm-<id>.out where it was submitted; keep that here
        return subprocess.run(
            list(argv), env=self.env, capture_output=True, text=True, check=check, timeout=timeout, cwd=self.base
        )

    # -- start ----------------------------------------------------------------------------

    def start(self, timeout: float = 60) -> "SlurmCluster":
        base = self.base
        os.chmod(base, 0o755)  # the munge user walks into munge/
        for sub in ("munge", "etc", "state", "spool", "log"):
            (base / sub).mkdir(exist_ok=True)
        mu = pwd.getpwnam("munge")
        os.chown(base / "munge", mu.pw_uid, mu.pw_gid)
        shutil.copy2("/etc/munge/munge.key", base / "munge" / "munge.key")
        os.chown(base / "munge" / "munge.key", mu.pw_uid, mu.pw_gid)
        os.chmod(base / "munge" / "munge.key", 0o400)
        subprocess.run(
            [
                "runuser",
                "-u",
                "munge",
                "--",
                "/usr/sbin/munged",
                f"--key-file={base}/munge/munge.key",
                f"--socket={base}/munge/munge.socket.2",
                f"--pid-file={base}/munge/munged.pid",
                f"--log-file={base}/munge/munged.log",
                f"--seed-file={base}/munge/munged.seed",
            ],
            check=True,
            capture_output=True,
            timeout=30,
        )
        self.munged_pid = int(_wait_file(base / "munge" / "munged.pid", 10).read_text().split()[0])
        accounting = "AccountingStorageType=accounting_storage/none"
        if self.accounting:
            accounting = self._start_slurmdbd()
        # Two "GPUs" per node that are not GPUs (/dev/null, /dev/zero; task/none binds nothing):
        # Slurm allocates them, counts them and sets CUDA_VISIBLE_DEVICES, which is what orch's
        # --gres and cost paths need; no CUDA code can run on them.
        (base / "etc" / "gres.conf").write_text(
            "AutoDetect=off\n" + "".join(f"NodeName={n} Name=gpu File=/dev/null,/dev/zero\n" for n in NODES)
        )
        self.conf.write_text(
            SLURM_CONF.format(
                host=socket.gethostname().split(".")[0],
                base=base,
                ctld_port=free_port(),
                n1_port=free_port(),
                n2_port=free_port(),
                grace=self.grace,
                accounting=accounting,
                min_job_age=self.min_job_age,
            )
        )
        self._spawn("slurmctld", ["/usr/sbin/slurmctld", "-D", "-i", "-f", str(self.conf)])
        for node in NODES:
            self.start_slurmd(node)
        self.wait_idle(timeout)
        return self

    def _start_slurmdbd(self) -> str:
        """MariaDB in base/mysql (its own socket and port) and slurmdbd on it; returns the
        slurm.conf lines that point slurmctld at it."""
        base = self.base
        my = base / "mysql"
        (my / "data").mkdir(parents=True, exist_ok=True)
        shutil.chown(my, "mysql", "mysql")
        shutil.chown(my / "data", "mysql", "mysql")
        subprocess.run(
            [
                "mariadb-install-db",
                "--user=mysql",
                f"--datadir={my}/data",
                "--skip-test-db",
                "--auth-root-authentication-method=socket",
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        db_port, dbd_port = free_port(), free_port()
        out = open(base / "log" / "mariadbd.out", "ab")
        self.procs["mariadbd"] = subprocess.Popen(
            [
                "runuser",
                "-u",
                "mysql",
                "--",
                "mariadbd",
                "--no-defaults",
                f"--datadir={my}/data",
                f"--socket={my}/mysql.sock",
                f"--port={db_port}",
                "--bind-address=127.0.0.1",
                "--skip-log-bin",
                f"--pid-file={my}/mariadbd.pid",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        out.close()
        sql = (
            "CREATE DATABASE IF NOT EXISTS slurm_acct_db; CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' "
            "IDENTIFIED BY 'orchtest'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;"
        )
        deadline = time.monotonic() + 60
        while (
            subprocess.run(
                ["mariadb", f"--socket={my}/mysql.sock", "-u", "root", "-e", sql], capture_output=True, timeout=30
            ).returncode
            != 0
        ):
            if time.monotonic() > deadline or self.procs["mariadbd"].poll() is not None:
                raise RuntimeError(f"MariaDB did not start: {(base / 'log' / 'mariadbd.out').read_text()[-2000:]}")
            time.sleep(0.3)
        dbd = base / "etc" / "slurmdbd.conf"
        dbd.write_text(
            f"AuthType=auth/munge\nAuthInfo=socket={base}/munge/munge.socket.2\nDbdHost=localhost\n"
            f"DbdAddr=127.0.0.1\nDbdPort={dbd_port}\nSlurmUser=root\nPidFile={base}/slurmdbd.pid\n"
            f"LogFile={base}/log/slurmdbd.log\nStorageType=accounting_storage/mysql\n"
            f"StorageHost=127.0.0.1\nStoragePort={db_port}\nStorageUser=slurm\nStoragePass=orchtest\n"
            f"StorageLoc=slurm_acct_db\n"
        )
        os.chmod(dbd, 0o600)
        self._spawn("slurmdbd", ["/usr/sbin/slurmdbd", "-D"])
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", dbd_port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or self.procs["slurmdbd"].poll() is not None:
                    raise RuntimeError(
                        f"slurmdbd did not start: {(base / 'log' / 'slurmdbd.out').read_text()[-2000:]}"
                    ) from None
                time.sleep(0.2)
        return (
            f"AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=localhost\n"
            f"AccountingStoragePort={dbd_port}\nAccountingStoragePass={base}/munge/munge.socket.2"
        )

    def _spawn(self, name: str, argv: list[str]) -> None:
        out = open(self.base / "log" / f"{name}.out", "ab")
        self.procs[name] = subprocess.Popen(
            argv, env=self.env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
        out.close()

    def start_slurmd(self, node: str) -> None:
        self._spawn(f"slurmd-{node}", ["/usr/sbin/slurmd", "-D", "-N", node, "-f", str(self.conf)])

    def node_states(self) -> dict[str, str]:
        r = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False, timeout=15)
        out = {}
        for line in r.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2:
                out[parts[0]] = parts[1]
        return out

    def wait_idle(self, timeout: float = 60, nodes: tuple[str, ...] = NODES) -> None:
        deadline = time.monotonic() + timeout
        while True:
            states = self.node_states()
            if all(states.get(n, "").rstrip("*") == "idle" for n in nodes):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"Slurm nodes not idle after {timeout}s: {states}; see {self.base}/log")
            for name, proc in self.procs.items():
                if proc.poll() is not None and name == "slurmctld":
                    raise RuntimeError(f"slurmctld exited: {(self.base / 'log' / 'slurmctld.out').read_text()[-2000:]}")
            time.sleep(0.2)

    # -- faults -----------------------------------------------------------------------------

    def kill9_slurmd(self, node: str) -> None:
        proc = self.procs[f"slurmd-{node}"]
        proc.kill()
        proc.wait(10)

    # -- jobs -------------------------------------------------------------------------------

    def cancel_all(self, timeout: float = 30) -> None:
        self.run("scancel", "--full", "-u", "root", check=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = self.run("squeue", "-h", "-o", "%i %T", check=False)
            if r.returncode == 0 and not r.stdout.strip():
                return
            time.sleep(0.3)

    # -- stop --------------------------------------------------------------------------------

    def stop(self) -> None:
        try:
            self.cancel_all(15)
        except Exception:
            pass
        order = {"slurmctld": 1, "slurmdbd": 2, "mariadbd": 3}  # the slurmds first, the database last
        for name in sorted(self.procs, key=lambda n: order.get(n, 0)):
            proc = self.procs[name]
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
        if self.munged_pid:
            try:
                os.kill(self.munged_pid, signal.SIGTERM)
            except OSError:
                pass


def _wait_file(path: Path, timeout: float) -> Path:
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text().strip():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} did not appear")
        time.sleep(0.05)
    return path
