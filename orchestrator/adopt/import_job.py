"""Adopting one planned job: take its lease, fetch the inputs that travelled, import the job
(attempts included, the one running when its machine died recorded as lost), fetch its checkpoint."""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ..contract import (
    BATCH,
    CHECKPOINTS,
    PROGRESS,
    PROVENANCE_FILES,
    RECOVERY_ENV_MARKET,
    RECOVERY_ENV_ZONE,
    TRACKING,
    atomic_file,
    provenance_dir,
    write_json_atomic,
)
from ..jobs.lifecycle import write_run_spec
from ..objectstore import claims, datafiles, machines, signing
from ..objectstore import manifest as mf
from ..objectstore.fetch import fetch_checkpoint
from ..objectstore.remote import Conflict, Remote, StorageError
from ..home.paths import Home
from ..model.records import Outgoing
from ..model.markets import MARKETS, ZONE_NAME
from ..model.states import JobState
from ..store import Store
from .candidates import Refused
from .plan import Plan


@dataclass
class Adopted:
    job_id: int
    uid: str
    name: str
    step: Optional[int]
    checkpoint: Optional[str]
    rejected: list[str]


def adopt_one(
    home: Home,
    store: Store,
    remote: Remote,
    plan: Plan,
    home_id: str,
    *,
    now: float,
    warn: Callable[[str], None],
    outgoing: Callable[[str], Sequence[Outgoing]] = lambda detail: (),
) -> Adopted:
    """Take one job over: the lease first, then its inputs, the import (one `adopted` event with its
    notifications, `outgoing(detail)`), then its newest checkpoint that verifies."""
    cand, label = plan.cand, plan.cand.label
    m = dict(cand.manifest or {})
    own = m.get("owner") or {}
    # Take the lease before downloading anything: of two machines adopting at once, one write wins.
    taken = signing.sign(dict(m, owner=mf.owner(home_id, now=now, by="adopt"), written_at=now), plan.keys)
    key = mf.manifest_key(cand.uid)
    try:
        etag = remote.cas_put(key, mf.dump(taken), cand.etag)
    except Conflict:
        raise Refused(
            f"{label}: its manifest changed while adopting (another machine adopted it or its owner wrote "
            "it); run `orch adopt` again to see who owns it"
        ) from None
    found, fetched = dict(plan.found), []
    try:
        for role in plan.to_fetch:  # inputs that travelled: into $ORCH_HOME/data/, verified
            found[role] = datafiles.fetch(remote, m["data_files"], role, home.root / "data", warn)
            fetched.append(found[role])
            warn(f"{label}: {role} downloaded to {found[role]}")
    except (ValueError, FileNotFoundError, StorageError) as exc:
        for path in fetched:  # nothing of a refused adoption stays behind
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
        # The old lease back, written now: a controller that read our lease would take an older
        # written_at for a replayed copy (recovery/trust.py) and never recover the job.
        _give_back(remote, key, signing.sign(dict(m, written_at=time.time()), plan.keys), etag)
        raise Refused(f"{label}: {exc}") from None
    resized = ""
    if plan.resized is not None:  # on another number of GPUs (jobs/regpu.py): the runner reshards
        resized = f"; on {plan.gpus} GPU(s) (was {m.get('gpus')})"
        m["spec"], m["gpus"] = plan.resized, plan.gpus
    m["spec"] = datafiles.rewrite(m["spec"], found)
    market, zone, waited = _launched_for(remote, cand.uid, own, now)
    # Import first (a new local id), then fetch the checkpoint into its run folder.
    detail = f"from host {own.get('host') or '?'} (its job {m.get('local_id')}) via {remote.url.raw}{waited}{resized}"
    job = store.import_job(
        m,
        state=JobState.QUEUED,
        reason="adopted from another machine; queued to resume",
        spec_path=str(m.get("spec_path") or ""),
        now=now,
        attempts=_attempts(m, now),
        detail=detail,
        outgoing=outgoing(detail),
    )
    run_dir = home.run_dir(job.id)
    write_run_spec(home, job.id, m["spec"])
    if m.get("batch"):
        write_json_atomic(run_dir / BATCH, m["batch"])
    fetch_provenance(remote, m, run_dir, label, warn)
    _fetch_tracking(remote, cand.uid, run_dir, warn)
    if isinstance(m.get("progress"), dict):
        # The old machines' progress, with their attempts' goodput figures: the runner keeps
        # earlier attempts' figures from this file, so the ledger sums over every machine.
        write_json_atomic(run_dir / PROGRESS, m["progress"])
    history = list(m["checkpoints"])
    good, rejected = fetch_checkpoint(remote, history, run_dir / CHECKPOINTS, warn)
    kept = [c for c in history if c["key"] not in rejected]
    store.mirror_set(
        job.id,
        cand.uid,
        machines=machines.on_adopt(
            m,
            home_id,
            market=market,
            zone=zone,
            now=now,
            step=kept[0]["step"] if kept else 0,
        ),
        etag=etag,
        manifest_at=now,
        checkpoints=kept,
        dirty=1,
        step=kept[0]["step"] if kept else None,
        uploaded_at=kept[0].get("uploaded_at") if kept else None,
    )
    for k in rejected:
        store.record_event(
            job.id,
            "adopted",
            now,
            detail=f"rejected {remote.where(k)}: missing, its sha256 or size "
            "does not match the manifest, or it does not unpack; fell "
            "back to an older checkpoint",
        )
    return Adopted(
        job.id,
        cand.uid,
        str(m["name"]),
        good["step"] if good else None,
        good["name"] if good else None,
        [remote.where(k) for k in rejected],
    )


def fetch_provenance(remote: Remote, m: dict[str, Any], run_dir: Path, label: str, warn: Callable[[str], None]) -> None:
    """The first machine's provenance files, so this machine's first attempt is compared with them
    (not taken as a new baseline). One that cannot be fetched is warned about, never fatal."""
    for name in m.get("provenance") or []:
        if name not in PROVENANCE_FILES:  # the manifest names files; only these names are written
            continue
        try:
            data = remote.get_bytes(mf.provenance_key(m["uid"], name))
        except StorageError as exc:
            data, why = None, str(exc)
        else:
            why = "missing"
        if data is None:
            warn(
                f"{label}: its provenance/{name} could not be fetched ({why}); this machine's environment is recorded instead"
            )
            continue
        with atomic_file(provenance_dir(run_dir) / name, "wb") as fh:
            fh.write(data)


def _launched_for(remote: Remote, uid: str, own: dict[str, Any], now: float) -> tuple[str, str, str]:
    """The market and zone `orch watch` launched this machine on (its newest launch claim; else the
    launch command's ORCH_RECOVERY_MARKET / ORCH_RECOVERY_ZONE; else unknown ""), and a note for the `adopted` event: since
    when the job waited for a replacement machine."""
    try:
        found = [c for c in claims.read_claims(remote, uid) if c.status in (claims.LAUNCHED, claims.CLAIMED)]
    except StorageError:
        found = []
    market = found[-1].market if found else os.environ.get(RECOVERY_ENV_MARKET, "")
    market = market if market in MARKETS else ""
    zone = str(found[-1].extra.get("zone") or "") if found else os.environ.get(RECOVERY_ENV_ZONE, "")
    zone = zone if ZONE_NAME.match(zone) else ""  # from the bucket: shown only as a zone's name can be
    waited = ""
    if found and found[-1].for_loss(own):
        since = claims.waiting_since(found, {"owner": own})
        if since is not None:
            waited = (
                f"; it waited {max(0.0, now - since):.0f} s for a replacement machine (launch {found[-1].n}"
                f"{', ' + market if market else ''}, by orch watch)"
            )
    return market, zone, waited


def _give_back(remote: Remote, key: str, original: dict[str, Any], etag: Optional[str]) -> None:
    """Put the manifest back as it was (lease included) after a failed adoption, if no one wrote it since."""
    try:
        remote.cas_put(key, mf.dump(original), etag)
    except (Conflict, StorageError):
        pass


def _attempts(m: dict[str, Any], now: float) -> list[dict[str, Any]]:
    """The manifest's attempts; one still running when the machine died is lost at the furthest
    step known: its mirrored progress, or the newest checkpoint it had mirrored."""
    out = [dict(a) for a in m.get("attempts") or []]
    if out and out[-1].get("ended_at") is None:
        last = out[-1]
        progress = m.get("progress") or {}
        last["step_reached"] = mf.furthest_step(m)  # the closed machine entry says the same (machines.py)
        ended = progress.get("updated_at")
        ok = isinstance(ended, (int, float)) and not isinstance(ended, bool) and 0 <= ended < 1e11
        last["ended_at"] = float(ended if ok and ended is not None else m.get("written_at") or now)
        last["outcome"] = "lost"
    return out


def _fetch_tracking(remote: Remote, uid: str, run_dir: Any, warn: Callable[[str], None]) -> None:
    """The job's tracker runs (tracking.json): an MLflow run id is known only from it (W&B's and
    SwanLab's come from the uid). Missing is normal; a failure only costs a new MLflow run."""
    try:
        data = remote.get_bytes(mf.file_key(uid, TRACKING))
    except StorageError as exc:
        warn(f"job {uid[:12]}: {TRACKING} not fetched ({exc}); an MLflow run may start anew")
        return
    if data:
        with atomic_file(run_dir / TRACKING, "wb") as fh:  # the runner reads it: never half of one
            fh.write(data)
