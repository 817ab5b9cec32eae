"""A job file queued twice in a row: the second `orch submit` of the same job.toml, unchanged,
while the first copy is still queued or running, is usually a slip (an up-arrow and Enter). Said in
a note, never refused: running the same file twice on purpose is legitimate (another seed)."""

from __future__ import annotations

from typing import Iterable, Optional

from ..cost.money import format_duration
from ..model.records import Job
from ..model.states import JobState


def repeat_note(new: Job, active: Iterable[Job], now: float) -> Optional[str]:
    """The note for `new` when the newest other queued or running job came from the same file
    with the same content; None otherwise."""
    others = [j for j in active if j.id != new.id and j.state in (JobState.QUEUED, JobState.RUNNING)]
    if not others or not new.spec_path:
        return None
    previous = max(others, key=lambda j: j.id)
    if previous.spec_path != new.spec_path or previous.spec != new.spec:
        return None
    ago = format_duration(max(0.0, now - previous.submitted_at))
    return (
        f"note: job {previous.id} ({previous.name}) was queued from the same {new.spec_path}, unchanged, "
        f"{ago} ago and is still {previous.state.value}: this is a second copy "
        f"(`orch cancel {new.id}` if that was a slip)"
    )
