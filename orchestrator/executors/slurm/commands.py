"""The Slurm client commands the executor runs (`sbatch`, `squeue`, `sacct`, `scancel`), each with a
timeout and counted; one that cannot run or does not answer is None (unknown, never an ending)."""

from __future__ import annotations

import getpass
import hashlib
import logging
import os
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Optional

from ...home.paths import Home
from ...model.records import Job
from .query import SACCT_FIELDS, SQUEUE_FORMAT, SlurmJob, accounting_disabled, parse_sacct, parse_squeue
from .script import SlurmError

if TYPE_CHECKING:
    from ...spec.config import SlurmSection

log = logging.getLogger("orch.executor.slurm")

QUERY_TIMEOUT_S = 30.0


class SlurmCommands:
    """Who asks (the user, the home's tag, the environment with SLURM_CONF) and the commands asked."""

    def __init__(self, home: Home, slurm: "SlurmSection", *, environ: Optional[Mapping[str, str]] = None):
        self.home = home
        self.cfg = slurm
        self.environ = dict(os.environ if environ is None else environ)
        if slurm.slurm_conf:
            self.environ["SLURM_CONF"] = str(Path(os.path.expanduser(slurm.slurm_conf)).resolve())
        self.user = getpass.getuser()
        self.tag = hashlib.sha1(str(home.root.resolve()).encode()).hexdigest()[:6]
        self.accounting: Optional[bool] = {"on": True, "off": False}.get(slurm.accounting)
        self.queries = {"squeue": 0, "sacct": 0, "sbatch": 0, "scancel": 0}

    def job_name(self, job_id: int, attempt: int) -> str:
        """orch-<home tag>-<job>.<attempt>: unique per ORCH_HOME, so two orch homes of one user on
        one cluster never mistake each other's jobs."""
        return f"orch-{self.tag}-{job_id}.{attempt}"

    def _find_by_name(self, job_id: int, attempt: int) -> Optional[str]:
        r = self._run(
            ["squeue", "-h", "-t", "all", "-u", self.user, f"--name={self.job_name(job_id, attempt)}", "-o", "%i"],
            what="squeue",
        )
        return (r.stdout.split() or [None])[0] if r is not None and r.returncode == 0 else None

    # -- Slurm commands ------------------------------------------------------------------------

    def _run(
        self,
        argv: list[str],
        *,
        env: Optional[Mapping[str, str]] = None,
        what: str = "",
        timeout: float = QUERY_TIMEOUT_S,
    ) -> Optional[subprocess.CompletedProcess]:
        """A Slurm command; None when it could not run or did not answer in time (unknown)."""
        self.queries[what or argv[0]] = self.queries.get(what or argv[0], 0) + 1
        try:
            return subprocess.run(
                argv,
                env=dict(env or self.environ),
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
        except FileNotFoundError as exc:
            if what == "sbatch":
                raise SlurmError(
                    f"{argv[0]} is not installed here (the daemon must run where Slurm's client "
                    "commands work, e.g. a login node)"
                ) from exc
            log.warning("%s: %s", argv[0], exc)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("%s did not answer: %s", argv[0], exc)
        return None

    def _squeue(self) -> Optional[dict[str, SlurmJob]]:
        r = self._run(["squeue", "-h", "-t", "all", "-u", self.user, "-o", SQUEUE_FORMAT], what="squeue")
        if r is None or r.returncode != 0:
            if r is not None:
                log.warning("squeue failed (rc %s): %s", r.returncode, (r.stderr or r.stdout).strip()[:300])
            return None
        return parse_squeue(r.stdout)

    def _accounting_on(self) -> bool:
        return self.accounting is not False

    def _sacct(self, ids: list[str], tracked: Mapping[str, Job]) -> Optional[dict[str, SlurmJob]]:
        since = min((tracked[s].executor_ref or {}).get("submitted_at") or time.time() for s in ids) - 86400
        start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since))
        r = self._run(
            ["sacct", "-X", "-n", "-P", "-j", ",".join(ids), f"--starttime={start}", "-o", SACCT_FIELDS], what="sacct"
        )
        if r is None:
            return None
        if r.returncode != 0:
            if accounting_disabled(r.stdout + r.stderr):
                if self.accounting is None:
                    log.info("Slurm accounting is off on this cluster: states come from squeue alone")
                self.accounting = False
                return {}  # nothing more to learn: squeue's silence is the answer
            log.warning("sacct failed (rc %s): %s", r.returncode, (r.stderr or r.stdout).strip()[:300])
            return None
        if self.accounting is None:
            self.accounting = True
        return parse_sacct(r.stdout)
