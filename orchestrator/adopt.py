"""`orch adopt URL`: take unfinished jobs over from another machine's mirror. The manifests are
untrusted input (objectstore/manifest_model.py checks each before anything else happens). For each
job: check its owner's lease (refuse a live one unless --force), show what it will run and get a
yes, take the lease with a conditional write (two machines adopting at once: one wins), download
the newest checkpoint whose sha256 matches (falling back down the history, naming any rejected
key), then import the job with its uid, attempts, cost and OOM batch adjustments, queued to
resume. The attempt that was running when the machine died is recorded as lost at the step its
mirrored progress reached, so the steps redone count as waste."""

from __future__ import annotations

import os
import shlex
import shutil
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .config import Config
from .contract import BATCH, CHECKPOINTS, write_json_atomic
from .errors import ConfigError, OrchError, UsageError
from .lifecycle import write_run_spec
from .paths import Home
from .states import JobState
from .store import Store
from .objectstore import datafiles
from .objectstore import manifest as mf
from .objectstore.fetch import fetch_checkpoint
from .objectstore.manifest_model import MAX_MANIFEST_BYTES, UID_PATTERN, ManifestError
from .objectstore.manifest_model import parse as parse_manifest
from .objectstore.remote import Conflict, Remote, StorageError, TooLarge

ADOPTABLE = ("queued", "running", "stopped")


class Refused(OrchError):
    """This job is not adopted (its lease is held, it is already here...)."""


class Rejected(Refused):
    """Its manifest is not one orch will act on: exit 2 when nothing was adopted."""

    exit_code = 2


@dataclass
class Candidate:
    uid: str
    manifest: Optional[dict[str, Any]]  # checked (manifest_model); None when `problem` says why not
    etag: Optional[str]
    problem: str = ""

    @property
    def label(self) -> str:
        name = (self.manifest or {}).get("name")
        return f"job {self.uid[:12]}" + (f" ({name})" if name else "")


@dataclass
class Plan:
    """One job that passed every check, and where its inputs are."""

    cand: Candidate
    found: dict[str, str]
    to_fetch: list[str]


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
    from pydantic import ValidationError

    from .config import StorageSection
    from .objectstore.url import credential_problems

    data = config.storage.model_dump()
    if url:
        data["url"] = url
    if not data.get("url"):
        raise UsageError("give the mirror's URL (orch adopt s3://bucket/prefix) or set [storage] url in config.toml")
    try:
        section = StorageSection.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(
            [f"storage.{'.'.join(map(str, e['loc']))}: {e['msg'].removeprefix('Value error, ')}" for e in exc.errors()]
        ) from None
    problems = credential_problems(section, os.environ if env is None else env)
    if problems:
        raise ConfigError(problems)
    return section


# -- reading the mirror ------------------------------------------------------------------------


def read_candidate(remote: Remote, uid: str) -> Optional[Candidate]:
    """One job's manifest, checked; None when none was ever committed."""
    import re

    if not re.fullmatch(UID_PATTERN, uid):
        return Candidate(uid, None, None, f"job {uid[:40]!r}: not a job folder orch writes (its name); skipped")
    key = mf.manifest_key(uid)
    try:
        got = remote.get_with_etag(key, max_bytes=MAX_MANIFEST_BYTES)
    except TooLarge as exc:
        return Candidate(
            uid, None, None, f"job {uid[:12]}: its manifest is over the {MAX_MANIFEST_BYTES >> 20} MB limit: {exc}"
        )
    if got is None:
        return None
    try:
        return Candidate(uid, parse_manifest(got[0], remote.where(key), uid), got[1])
    except ManifestError as exc:
        return Candidate(uid, None, got[1], str(exc))


def choose(remote: Remote, wanted: list[str], take_all: bool) -> list[Candidate]:
    """The jobs asked for. `--job` by id or id prefix reads only those manifests; a name is looked
    up in every readable manifest."""
    uids: list[str] = sorted(remote.list_dirs("jobs"))
    if take_all:
        every = [c for c in (read_candidate(remote, u) for u in uids) if c is not None]
        return [c for c in every if c.manifest is None or c.manifest.get("state") in ADOPTABLE]
    chosen: list[Candidate] = []
    by_name: Optional[list[Candidate]] = None
    for w in wanted:
        hits = [u for u in uids if u == w or (len(w) >= 4 and u.startswith(w))]
        if len(hits) > 1:
            raise UsageError(
                f"--job {w}: matches {len(hits)} jobs ({', '.join(u[:12] for u in hits)}); give more of the id"
            )
        if hits:
            cand = read_candidate(remote, hits[0])
            if cand is None:
                raise UsageError(f"--job {w}: its manifest was never written (nothing was committed to the mirror)")
            chosen.append(cand)
            continue
        if by_name is None:
            by_name = [c for c in (read_candidate(remote, u) for u in uids) if c is not None and c.manifest]
        named = [c for c in by_name if c.manifest and c.manifest.get("name") == w]
        if not named:
            raise UsageError(f"--job {w}: no such job in the mirror (give its global id, a prefix of it, or its name)")
        if len(named) > 1:
            raise UsageError(
                f"--job {w}: {len(named)} jobs have that name ({', '.join(c.uid[:12] for c in named)}); give the id"
            )
        chosen.append(named[0])
    return chosen


def parse_maps(values: list[str]) -> list[tuple[str, str]]:
    out = []
    for v in values:
        old, sep, new = v.partition("=")
        if not sep or not old.startswith("/") or not new.startswith("/"):
            raise UsageError(
                f"--map {v}: give OLD=NEW, two absolute folders (an input under OLD is looked for under NEW)"
            )
        out.append((old, new))
    return out


# -- checks, before anything is written ----------------------------------------------------------


def check(
    store: Store,
    section: Any,
    cand: Candidate,
    home_id: str,
    *,
    force: bool,
    now: float,
    mapping: list[tuple[str, str]],
) -> Plan:
    """Everything that can refuse a job without touching the mirror, the store or the disk."""
    if cand.manifest is None:
        raise Rejected(cand.problem)
    m, label = cand.manifest, cand.label
    local = store.by_uid(cand.uid)
    if local is not None:
        raise Refused(f"{label} is already in this store as job {local.id}")
    if m["state"] not in ADOPTABLE:
        raise Refused(f"{label} is {m['state']}: only queued, running or stopped jobs are adopted")
    own = m.get("owner") or {}
    holder = None if own.get("home_id") == home_id else mf.lease_holder(m, now, section.stale_after_minutes * 60)
    if holder and not force:
        raise Refused(
            f"{label} is still owned by {holder}; stop its daemon there (`orch daemon stop` releases it), "
            "wait until the heartbeat is stale, or adopt with --force if that machine is gone"
        )
    found, to_fetch, problems = datafiles.plan(list(m["data_files"]), mapping)
    if problems:
        raise Refused(f"{label}: its input files are not on this machine:\n  " + "\n  ".join(problems))
    return Plan(cand, found, to_fetch)


def what_it_runs(m: dict[str, Any]) -> str:
    """One line: the command and its folder, or the built-in job's model and data."""
    spec = m["spec"]
    if spec.get("command"):
        where = spec.get("workdir") or "its run folder: the manifest names no workdir"
        return f"command {shlex.join(spec['command'])}  (in {where})"
    model, data = spec.get("model") or {}, spec.get("data") or {}
    return f"built-in fine-tune of {model.get('name_or_path')!s} on {data.get('train')!s}" + (
        f" (validation {data['validation']})" if data.get("validation") else ""
    )


def preview(plans: list[Plan]) -> list[str]:
    lines = []
    for p in plans:
        m = p.cand.manifest or {}
        lines.append(f"  {p.cand.uid[:12]}  {m['name']}  [{m['kind']}, {m['state']}, {m['gpus']} GPU]")
        lines.append(f"      {what_it_runs(m)}")
        if m["spec"].get("env"):
            lines.append(f"      env: {', '.join(sorted(m['spec']['env']))}")
    return lines


# -- the use case ----------------------------------------------------------------------------------


def adopt_jobs(
    home: Home,
    config: Config,
    store: Store,
    url: Optional[str],
    *,
    wanted: list[str],
    take_all: bool,
    force: bool,
    say: Callable[[str], None],
    warn: Callable[[str], None],
    confirm: Callable[[list[str]], bool],
    now: Optional[float] = None,
    maps: Optional[list[str]] = None,
) -> tuple[list[Adopted], list[Refused]]:
    """Returns (adopted jobs, refusals). `confirm` is shown what each job runs and says whether
    to go on. Raises OrchError for a store that cannot be read."""
    if not wanted and not take_all:
        raise UsageError("say which jobs: --job ID (repeatable) or --all")
    mapping = parse_maps(maps or [])
    section = storage_for(config, url)
    remote = Remote(section)
    home_id = mf.home_identity(home)
    try:
        chosen = choose(remote, wanted, take_all)
    except StorageError as exc:
        raise OrchError(f"cannot read the mirror: {exc}") from None
    if not chosen:
        say(f"no unfinished jobs in {section.url}")
        return [], []
    plans, refused = [], []
    for cand in chosen:
        try:
            plans.append(
                check(
                    store, section, cand, home_id, force=force, mapping=mapping, now=time.time() if now is None else now
                )
            )
        except Refused as exc:
            refused.append(exc)
            warn(f"refused: {exc}")
    if not plans:
        return [], refused
    if not confirm(preview(plans)):
        return [], refused
    adopted = []
    for plan in plans:
        t = time.time() if now is None else now
        try:
            result = adopt_one(home, store, remote, plan, home_id, now=t, warn=warn)
        except (Refused, StorageError) as exc:
            why = exc if isinstance(exc, Refused) else Refused(f"{plan.cand.label}: {exc}")
            refused.append(why)
            warn(f"refused: {why}")
            continue
        adopted.append(result)
        where = (
            f"resuming from step {result.step} ({result.checkpoint}, sha256 verified)"
            if result.checkpoint
            else "starting from scratch (no checkpoint mirrored)"
        )
        say(f"adopted {result.uid[:12]} ({result.name}) as job {result.job_id}: {where}")
    return adopted, refused


def exit_code(adopted: list[Adopted], refused: list[Refused]) -> int:
    if not refused:
        return 0
    if not adopted and all(r.exit_code == 2 for r in refused):
        return 2
    return 1


def adopt_one(
    home: Home, store: Store, remote: Remote, plan: Plan, home_id: str, *, now: float, warn: Callable[[str], None]
) -> Adopted:
    cand, label = plan.cand, plan.cand.label
    m = dict(cand.manifest or {})
    own = m.get("owner") or {}
    # Take the lease before downloading anything: of two machines adopting at once, one write wins.
    taken = dict(m, owner=mf.owner(home_id, now=now, by="adopt"), written_at=now)
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
        _give_back(remote, key, m, etag)
        raise Refused(f"{label}: {exc}") from None
    m["spec"] = datafiles.rewrite(m["spec"], found)
    # Import first (a new local id), then fetch the checkpoint into its run folder.
    job = store.import_job(
        m,
        state=JobState.QUEUED,
        reason="adopted from another machine; queued to resume",
        spec_path=str(m.get("spec_path") or ""),
        now=now,
        attempts=_attempts(m, now),
        detail=f"from host {own.get('host') or '?'} (its job {m.get('local_id')}) via {remote.url.raw}",
    )
    run_dir = home.run_dir(job.id)
    write_run_spec(home, job.id, m["spec"])
    if m.get("batch"):
        write_json_atomic(run_dir / BATCH, m["batch"])
    history = list(m["checkpoints"])
    good, rejected = fetch_checkpoint(remote, history, run_dir / CHECKPOINTS, warn)
    kept = [c for c in history if c["key"] not in rejected]
    store.mirror_set(
        job.id,
        cand.uid,
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
        steps = [
            s
            for s in (progress.get("step"), last.get("step_reached"), mf.newest_step(m))
            if isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**63
        ]
        last["step_reached"] = max(steps) if steps else None
        ended = progress.get("updated_at")
        ok = isinstance(ended, (int, float)) and not isinstance(ended, bool) and 0 <= ended < 1e11
        last["ended_at"] = float(ended if ok and ended is not None else m.get("written_at") or now)
        last["outcome"] = "lost"
    return out
