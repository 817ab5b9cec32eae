"""The daemon's mean time between preemptions on this machine, handed to jobs it starts as
ORCH_MTBF_S: `[checkpoint] every = "auto"` (training/resume/autointerval.py) chooses its interval from it."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("orch.daemon")


def update_mtbf(rt: Any) -> None:
    """ORCH_MTBF_S for jobs started from now on: this machine's MTBF (planning/mtbf.py; none seen:
    unset, and the runner assumes its default)."""
    from ..contract import ENV_MTBF_S
    from ..planning.mtbf import machine_mtbf

    try:
        mtbf = machine_mtbf(*rt.store.preemption_history())
    except Exception:
        log.exception("cannot read the preemption history")
        return
    if mtbf is not None:
        rt.daemon.environ[ENV_MTBF_S] = f"{mtbf[0]:.0f}"
    else:
        rt.daemon.environ.pop(ENV_MTBF_S, None)
