"""Reading Slurm's answers: squeue/sacct lines, node lists, durations, and what a state means for
an attempt. Pure functions (no subprocess), so the edge cases (empty answers, version
differences, errors) are unit-tested on canned text; the executor itself is tested on a real
Slurm (tests/slurm/)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

# squeue -o: one job a line, fields joined by SEP (no Slurm field can hold it)
SEP = "|"
SQUEUE_FORMAT = SEP.join(["%i", "%T", "%r", "%N", "%M", "%j"])
SACCT_FIELDS = "JobID,State,ExitCode,ElapsedRaw,NodeList,JobName"

# Still in Slurm's hands: the attempt may run (or run again).
ACTIVE = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
        "STOPPED",
        "RESV_DEL_HOLD",
        "SPECIAL_EXIT",
    }
)
# Ended by the infrastructure, not by the job: no exit record means a lost attempt (requeued, uncharged).
INFRA_ENDS = frozenset({"NODE_FAIL", "BOOT_FAIL", "PREEMPTED", "DEADLINE"})
# Ended: the job's own exit record (attempt-<n>.exit) says how.
ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "REVOKED"}) | INFRA_ENDS
BILLABLE = frozenset({"RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT"})


@dataclass(frozen=True)
class SlurmJob:
    job_id: str
    state: str  # squeue's %T / sacct's State, first word ("CANCELLED by 0" -> CANCELLED)
    reason: str = ""
    nodes: str = ""  # Slurm's compressed node list, e.g. n[1-2]
    elapsed_s: Optional[float] = None
    name: str = ""
    exit_code: Optional[int] = None  # sacct only
    exit_signal: Optional[int] = None

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    @property
    def ended(self) -> bool:
        return self.state in ENDED or (not self.active and bool(self.state))

    def describe(self) -> str:
        """`PENDING (Resources)`, `RUNNING on n1,n2`, `NODE_FAIL on n1`."""
        text = self.state
        if self.state == "PENDING" and self.reason and self.reason != "None":
            text += f" ({self.reason})"
        nodes = expand_nodelist(self.nodes)
        if nodes and self.state != "PENDING":
            text += " on " + ",".join(nodes[:8]) + (f" (+{len(nodes) - 8})" if len(nodes) > 8 else "")
        return text


def parse_squeue(text: str) -> dict[str, SlurmJob]:
    """Lines of SQUEUE_FORMAT. Lines that do not have its shape (warnings, a changed format) are
    skipped, never read as a job."""
    jobs = {}
    for line in text.splitlines():
        parts = line.strip().split(SEP)
        if len(parts) < 6 or not re.fullmatch(r"\d+(_\d+)?", parts[0]):
            continue
        job_id, state, reason, nodes, elapsed, name = parts[:6]
        jobs[job_id] = SlurmJob(
            job_id=job_id,
            state=_state_word(state),
            reason=reason.strip(),
            nodes="" if nodes in ("", "(null)") else nodes,
            elapsed_s=parse_duration(elapsed),
            name=name,
        )
    return jobs


def parse_sacct(text: str) -> dict[str, SlurmJob]:
    """`sacct -X -n -P -o SACCT_FIELDS` lines. With several records for one id (a job requeued by
    Slurm shows each run with -D) the last one wins."""
    jobs = {}
    for line in text.splitlines():
        parts = line.strip().split(SEP)
        if len(parts) < 6 or not re.fullmatch(r"\d+(_\d+)?", parts[0]):
            continue  # steps (123.batch) are not asked for (-X) and skipped if they come anyway
        job_id, state, exit_code, elapsed, nodes, name = parts[:6]
        code, sig = parse_exit_code(exit_code)
        jobs[job_id] = SlurmJob(
            job_id=job_id,
            state=_state_word(state),
            nodes="" if nodes in ("", "None assigned") else nodes,
            elapsed_s=float(elapsed) if elapsed.strip().isdigit() else None,
            name=name,
            exit_code=code,
            exit_signal=sig,
        )
    return jobs


def accounting_disabled(text: str) -> bool:
    """sacct's answer on a cluster without slurmdbd (rc 1)."""
    return "accounting storage is disabled" in text.lower()


def _state_word(state: str) -> str:
    # sacct: "CANCELLED by 0"; some versions print "CANCELLED+" when truncated
    return state.strip().split(" ")[0].rstrip("+").upper()


def parse_exit_code(text: str) -> tuple[Optional[int], Optional[int]]:
    """sacct's ExitCode `code:signal` -> (code, signal); (None, sig) when a signal ended it."""
    m = re.fullmatch(r"\s*(\d+):(\d+)\s*", text or "")
    if not m:
        return None, None
    code, sig = int(m.group(1)), int(m.group(2))
    return (None, sig) if sig else (code, None)


_DURATION = re.compile(r"^(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)(?:\.\d+)?$")


def parse_duration(text: str) -> Optional[float]:
    """Slurm's `[D-][HH:]MM:SS` (squeue %M, sacct Elapsed) -> seconds; None for INVALID/UNLIMITED."""
    m = _DURATION.match((text or "").strip())
    if not m:
        return None
    days, hours, minutes, seconds = (int(g) if g else 0 for g in m.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def expand_nodelist(text: str) -> list[str]:
    """Slurm's compressed host list -> names: `n[1-2],gpu[01-03,07]` -> n1, n2, gpu01, gpu02, gpu03, gpu07."""
    text = (text or "").strip()
    if not text or text in ("(null)", "None", "None assigned"):
        return []
    names: list[str] = []
    for item in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,\[]*", text):
        m = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", item)
        if not m:
            names.append(item)
            continue
        prefix, ranges, suffix = m.groups()
        for part in ranges.split(","):
            if "-" in part:
                lo, hi = part.split("-", 1)
                width = len(lo)
                try:
                    names += [f"{prefix}{i:0{width}d}{suffix}" for i in range(int(lo), int(hi) + 1)]
                except ValueError:
                    names.append(f"{prefix}{part}{suffix}")
            else:
                names.append(f"{prefix}{part}{suffix}")
    return names


def parse_sbatch(text: str) -> Optional[str]:
    """`sbatch --parsable` prints `jobid[;cluster]`."""
    for line in text.splitlines():
        m = re.fullmatch(r"\s*(\d+)(?:;\S+)?\s*", line)
        if m:
            return m.group(1)
    return None
