"""`orch watch`: one pass over the mirror's jobs, and the loop that repeats it.

For each unfinished job whose owner lease has been silent longer than [storage]
stale_after_minutes and was not released, the controller
  1. asks the provider whether the old machine is gone (False: leave it; None/True: go on),
  2. queues `machine_lost` (once per lapsed lease),
  3. refuses past `max_launches` or what `max_cost` can pay for (one `relaunch_failed`),
  4. chooses the market (market.py),
  5. claims launch n in the mirror, create-only (claims.py), BEFORE calling the provider,
  6. reads the manifest again: a lease that came back to life cancels the claim,
  7. calls the provider off the loop (launcher.py), the jobs one lost machine held together on one
     machine (placing.py): `relaunched`; `capacity_wait` when the market has no capacity (the job
     waits, free; the claim is reused, not counted toward max_launches); or `relaunch_failed` and
     a backoff before the next claim.
A claim that did not lead to an adoption within `launch_timeout_minutes` (the controller died
mid-launch, or the machine never came up) is followed by the next claim, and its machine is
stopped. Every machine launched is in the ledger (ledger.py, machines.py) until it is stopped.
The controller never runs a job."""

from __future__ import annotations

from ..objectstore.remote import StorageError
from .jobpass import JobPass
from .jobview import (
    ALIVE,
    DONE,
    LAUNCHING,
    LEFT,
    RELEASED,
    UNREADABLE,
    UNTRUSTED,
    WAITING,
    JobView,
    launch_key,
)
from .outcomes import Launching

__all__ = [
    "ALIVE",
    "DONE",
    "LAUNCHING",
    "LEFT",
    "RELEASED",
    "UNREADABLE",
    "UNTRUSTED",
    "WAITING",
    "Controller",
    "JobView",
    "launch_key",
]


class Controller(JobPass, Launching):
    """`orch watch`'s controller: one pass over the mirror's jobs (pass_once), made of the per-job
    pass (jobpass.py) and the launch outcomes (outcomes.py) over the state and helpers of core.py;
    after the pass, the machine ledger (machines.py) stops what is no longer needed."""

    # -- one pass -----------------------------------------------------------------------------

    def pass_once(self) -> list[JobView]:
        """Look at every job in the mirror once; launch where a lease lapsed. Raises StorageError
        when the mirror cannot be listed (the loop retries at the next poll)."""
        views = []
        self._collect()
        self._placing, self._views, self._seen, self._pass_answers = [], {}, {}, {}
        self.next_review = None
        for uid in sorted(self.remote.list_dirs("jobs")):
            try:
                view = self._job(uid)
            except StorageError as exc:  # one job's objects unreadable now: the others still go
                view = JobView(uid, "", UNREADABLE, f"cannot read the mirror: {exc}")
            if view is None:
                continue
            views.append(view)
            self._views[uid] = view
        self._place()
        self.book.account(self._seen, self.clock())  # stop what is no longer needed
        self._collect()
        self.ledger.note = self.pool_note()
        self.ledger.flush()
        for view in views:
            uid = view.uid
            shown = (view.name, view.state, view.waiting_since, view.launches, view.losses, view.market, view.note)
            if self._shown.get(uid) == shown:
                continue  # nothing new: no write
            self._shown[uid] = shown
            self.store.recovery_set(
                uid,
                self.clock(),
                name=view.name,
                url=self.remote.url.raw,
                state=view.state,
                waiting_since=view.waiting_since,
                launches=view.launches,
                losses=view.losses,
                market=view.market,
                note=view.note,
            )
        return views
