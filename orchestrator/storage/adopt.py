"""`orch adopt URL`: take unfinished jobs over from another machine's mirror. For each job: check
its owner's lease (refuse a live one unless --force), take the lease with a conditional write
(two machines adopting at once: one wins), download the newest checkpoint the manifest names and
verify its sha256 (falling back down the history, naming any rejected key), then import the job
with its uid, attempts, cost and OOM batch adjustments into this machine's store, queued to
resume. The attempt that was running when the machine died is recorded as lost at the step its
mirrored progress reached, so the steps redone count as waste."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from ..config import Config
from ..contract import BATCH, CHECKPOINTS, write_json_atomic
from ..errors import ConfigError, OrchError, UsageError
from ..lifecycle import write_run_spec
from ..paths import Home
from ..states import JobState
from ..store import Store
from . import manifest as mf
from .remote import Conflict, Remote, StorageError
from .url import credential_problems
from .packing import PACKED_TAR, unpack_folder

ADOPTABLE = ("queued", "running", "stopped")


@dataclass
class Candidate:
    uid: str
    manifest: dict[str, Any]
    etag: Optional[str]


@dataclass
class Adopted:
    job_id: int
    uid: str
    name: str
    step: Optional[int]
    checkpoint: Optional[str]
    rejected: list[str]


def storage_for(config: Config, url: Optional[str], env: Optional[dict[str, str]] = None) -> Any:
    """[storage] with the URL given on the command line (the other keys from config.toml)."""
    import os

    from pydantic import ValidationError

    from ..config import StorageSection

    data = config.storage.model_dump()
    if url:
        data["url"] = url
    if not data.get("url"):
        raise UsageError("give the mirror's URL (orch adopt s3://bucket/prefix) or set [storage] url in config.toml")
    try:
        section = StorageSection.model_validate(data)
    except ValidationError as exc:
        raise ConfigError([f"storage.{'.'.join(map(str, e['loc']))}: {e['msg'].removeprefix('Value error, ')}"
                           for e in exc.errors()]) from None
    problems = credential_problems(section, os.environ if env is None else env)
    if problems:
        raise ConfigError(problems)
    return section


def list_candidates(remote: Remote, warn: Callable[[str], None]) -> list[Candidate]:
    out = []
    for uid in sorted(remote.list_dirs("jobs")):
        key = mf.manifest_key(uid)
        got = remote.get_with_etag(key)
        if got is None:
            continue  # a job whose first manifest was never written: nothing committed
        try:
            m = mf.parse_manifest(got[0], remote.where(key))
        except ValueError as exc:
            warn(f"warning: skipping {exc}")
            continue
        out.append(Candidate(uid, m, got[1]))
    return out


def select(candidates: list[Candidate], wanted: list[str], take_all: bool) -> list[Candidate]:
    if take_all:
        return [c for c in candidates if c.manifest.get("state") in ADOPTABLE]
    chosen = []
    for w in wanted:
        hits = [c for c in candidates if c.uid == w or c.manifest.get("name") == w or (len(w) >= 4 and c.uid.startswith(w))]
        if not hits:
            raise UsageError(f"--job {w}: no such job in the mirror (give its global id, a prefix of it, or its name)")
        if len(hits) > 1:
            raise UsageError(f"--job {w}: matches {len(hits)} jobs ({', '.join(c.uid[:12] for c in hits)}); give more of the id")
        chosen.append(hits[0])
    return chosen


def parse_maps(values: list[str]) -> list[tuple[str, str]]:
    out = []
    for v in values:
        old, sep, new = v.partition("=")
        if not sep or not old.startswith("/") or not new.startswith("/"):
            raise UsageError(f"--map {v}: give OLD=NEW, two absolute folders (an input under OLD is looked for under NEW)")
        out.append((old, new))
    return out


def adopt_jobs(home: Home, config: Config, store: Store, url: Optional[str], *, wanted: list[str], take_all: bool,
               force: bool, say: Callable[[str], None], warn: Callable[[str], None],
               now: Optional[float] = None, maps: Optional[list[str]] = None) -> tuple[list[Adopted], list[str]]:
    """Returns (adopted jobs, refusals). Raises OrchError for a store that cannot be read."""
    if not wanted and not take_all:
        raise UsageError("say which jobs: --job ID (repeatable) or --all")
    mapping = parse_maps(maps or [])
    section = storage_for(config, url)
    remote = Remote(section)
    home_id = mf.home_identity(home)
    try:
        candidates = list_candidates(remote, warn)
    except StorageError as exc:
        raise OrchError(f"cannot read the mirror: {exc}") from None
    chosen = select(candidates, wanted, take_all)
    if not chosen:
        say(f"no unfinished jobs in {section.url}")
        return [], []
    adopted, refused = [], []
    for cand in chosen:
        t = time.time() if now is None else now
        try:
            result = adopt_one(home, store, remote, section, cand, home_id, force=force, now=t, warn=warn,
                               mapping=mapping)
        except Refused as exc:
            refused.append(str(exc))
            warn(f"refused: {exc}")
            continue
        except StorageError as exc:
            refused.append(f"job {cand.uid[:12]}: {exc}")
            warn(f"refused: job {cand.uid[:12]}: {exc}")
            continue
        adopted.append(result)
        where = (f"resuming from step {result.step} ({result.checkpoint}, sha256 verified)" if result.checkpoint
                 else "starting from scratch (no checkpoint mirrored)")
        say(f"adopted {result.uid[:12]} ({result.name}) as job {result.job_id}: {where}")
    return adopted, refused


class Refused(OrchError):
    pass


def adopt_one(home: Home, store: Store, remote: Remote, section: Any, cand: Candidate, home_id: str, *, force: bool,
              now: float, warn: Callable[[str], None], mapping: Optional[list[tuple[str, str]]] = None) -> Adopted:
    from . import datafiles

    m = cand.manifest
    label = f"job {cand.uid[:12]} ({m.get('name')})"
    local = store.by_uid(cand.uid)
    if local is not None:
        raise Refused(f"{label} is already in this store as job {local.id}")
    if m.get("state") not in ADOPTABLE:
        raise Refused(f"{label} is {m.get('state')}: only queued, running or stopped jobs are adopted")
    own = m.get("owner") or {}
    holder = None if own.get("home_id") == home_id else mf.lease_holder(m, now, section.stale_after_minutes * 60)
    if holder and not force:
        raise Refused(f"{label} is still owned by {holder}; stop its daemon there (`orch daemon stop` releases it), "
                      "wait until the heartbeat is stale, or adopt with --force if that machine is gone")
    inputs = list(m.get("data_files") or [])
    found, to_fetch, problems = datafiles.plan(inputs, mapping or [])
    if problems:
        raise Refused(f"{label}: its input files are not on this machine:\n  " + "\n  ".join(problems))
    # Take the lease before downloading anything: of two machines adopting at once, one write wins.
    taken = dict(m, owner=mf.owner(home_id, now=now, by="adopt"), written_at=now)
    key = mf.manifest_key(cand.uid)
    try:
        etag = remote.cas_put(key, mf.dump(taken), cand.etag)
    except Conflict:
        raise Refused(f"{label}: its manifest changed while adopting (another machine adopted it or its owner wrote "
                      "it); run `orch adopt` again to see who owns it") from None

    for role in to_fetch:  # inputs that travelled: into $ORCH_HOME/data/, verified
        try:
            found[role] = datafiles.fetch(remote, inputs, role, home.root / "data", warn)
        except (ValueError, FileNotFoundError) as exc:
            raise Refused(f"{label}: {exc}") from None
        warn(f"{label}: {role} downloaded to {found[role]}")
    m = dict(m, spec=datafiles.rewrite(m.get("spec") or {}, found))
    # Import first (a new local id), then fetch the checkpoint into its run folder.
    attempts = _attempts(m, now)
    job = store.import_job(m, state=JobState.QUEUED, reason="adopted from another machine; queued to resume",
                           spec_path=str(m.get("spec_path") or ""), now=now, attempts=attempts,
                           detail=f"from host {own.get('host') or '?'} (its job {m.get('local_id')}) via {remote.url.raw}")
    run_dir = home.run_dir(job.id)
    write_run_spec(home, job.id, m.get("spec") or {})
    if m.get("batch"):
        write_json_atomic(run_dir / BATCH, m["batch"])
    history = list(m.get("checkpoints") or [])
    good, rejected = fetch_checkpoint(remote, history, run_dir / CHECKPOINTS, warn)
    kept = [c for c in history if c["key"] not in rejected]
    store.mirror_set(job.id, cand.uid, etag=etag, manifest_at=now, checkpoints=kept, dirty=1,
                     step=kept[0]["step"] if kept else None, uploaded_at=kept[0].get("uploaded_at") if kept else None)
    for k in rejected:
        store.record_event(job.id, "adopted", now, detail=f"rejected {remote.where(k)}: its sha256 or size does not match "
                                                          "the manifest; fell back to an older checkpoint")
    return Adopted(job.id, cand.uid, str(m.get("name")), good["step"] if good else None,
                   good["name"] if good else None, [remote.where(k) for k in rejected])


def _attempts(m: dict[str, Any], now: float) -> list[dict[str, Any]]:
    """The manifest's attempts; one still running when the machine died is lost at the furthest
    step known: its mirrored progress, or the newest checkpoint it had mirrored."""
    out = [dict(a) for a in m.get("attempts") or []]
    if out and out[-1].get("ended_at") is None:
        last = out[-1]
        progress = m.get("progress") or {}
        steps = [s for s in (progress.get("step"), last.get("step_reached"), mf.newest_step(m)) if isinstance(s, int)]
        last["step_reached"] = max(steps) if steps else None
        last["ended_at"] = float(progress.get("updated_at") or m.get("written_at") or now)
        last["outcome"] = "lost"
    return out


def fetch_checkpoint(remote: Remote, history: list[dict[str, Any]], folder: Path,
                     warn: Callable[[str], None]) -> tuple[Optional[dict[str, Any]], list[str]]:
    """Download the newest checkpoint of `history` whose sha256 and size match; older ones only
    if a newer one is missing or corrupt. Returns (the one used or None, rejected keys)."""
    rejected: list[str] = []
    for record in history:
        packed = record.get("packed") == PACKED_TAR  # a folder checkpoint (storage/packing.py)
        dest = folder / (f".{record['name']}.tar" if packed else record["name"])
        try:
            sha, size = remote.download(record["key"], dest)
        except FileNotFoundError:
            warn(f"warning: {remote.where(record['key'])} is missing; falling back to an older checkpoint")
            rejected.append(record["key"])
            continue
        if sha != record["sha256"] or size != record["bytes"]:
            dest.unlink(missing_ok=True)
            warn(f"warning: rejected {remote.where(record['key'])}: sha256 {sha[:16]}… size {size} does not match the "
                 f"manifest's {record['sha256'][:16]}… size {record['bytes']}; falling back to an older checkpoint")
            rejected.append(record["key"])
            continue
        if packed:
            unpack_folder(dest, folder / record["name"])
            dest.unlink(missing_ok=True)
        return record, rejected
    if history:
        warn("warning: no mirrored checkpoint could be used; the job starts from scratch")
    return None, rejected


def describe(candidates: list[Candidate], now: float, stale_after_s: float) -> list[str]:
    lines = []
    for c in candidates:
        m = c.manifest
        holder = mf.lease_holder(m, now, stale_after_s)
        lines.append(f"{c.uid[:12]}  {m.get('name')}  {m.get('state')}  step {mf.newest_step(m)}  "
                     + (f"owned by {holder}" if holder else "free"))
    return lines


def dumps(obj: Any) -> str:
    return json.dumps(obj, default=str)
