"""`orch adopt URL`: take unfinished jobs over from another machine's mirror. This package's
front: the names the CLI and tests import.

The manifests are untrusted input (objectstore/manifest_model.py checks each before anything else
happens; candidates.py). For each job: check its owner's lease (refuse a live one unless --force),
show what it will run and get a yes (plan.py), take the lease with a conditional write (two
machines adopting at once: one wins), download the newest checkpoint whose sha256 matches (falling
back down the history, naming any rejected key), then import the job with its uid, attempts, cost
and OOM batch adjustments, queued to resume (import_job.py). The attempt that was running when the
machine died is recorded as lost at the step its mirrored progress reached, so the steps redone
count as waste. use_case.py runs these steps in order."""

from .candidates import ADOPTABLE, Candidate, Refused, Rejected
from .import_job import Adopted
from .plan import Plan, storage_for
from .use_case import adopt_jobs, exit_code

__all__ = [
    "ADOPTABLE",
    "Adopted",
    "Candidate",
    "Plan",
    "Refused",
    "Rejected",
    "adopt_jobs",
    "exit_code",
    "storage_for",
]
