"""Planning an adoption before anything is written: the mirror's [storage] section, the --map
folders, the checks that refuse a job, and the preview of what each job will run."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from ..spec.config import Config
from ..model.errors import ConfigError, UsageError
from ..jobs.regpu import fewer_gpus_allowed, resized_spec
from ..objectstore import datafiles
from ..objectstore import manifest as mf
from ..store import Store
from ..objectstore.signing import Keys
from .candidates import ADOPTABLE, Candidate, Held, Refused, Rejected, Untrusted


@dataclass
class Plan:
    """One job that passed every check, and where its inputs are."""

    cand: Candidate
    found: dict[str, str]
    to_fetch: list[str]
    keys: Optional[Keys] = None  # the bucket key: the lease taken is signed with it
    resized: Optional[dict[str, Any]] = None  # its spec on another number of GPUs (regpu.py), or None
    note: str = ""  # a warning to show with it (a machine with too few GPUs for it)

    @property
    def gpus(self) -> int:
        """The GPUs it will run on here."""
        return int((self.resized or (self.cand.manifest or {})).get("gpus") or 0)


def storage_for(
    config: Config,
    url: Optional[str],
    env: Optional[dict[str, str]] = None,
    *,
    how: str = "orch adopt s3://bucket/prefix",
    must_exist: bool = False,
) -> Any:
    """[storage] with the URL given on the command line (the other keys from config.toml). `how`:
    how this command takes a URL, for the message when there is none. `must_exist`: a command
    that only reads the mirror (watch, status) refuses a file:// folder that is not there — a
    typo or a disk not mounted, which would read as "no jobs"."""
    from pydantic import ValidationError

    from ..spec.config import StorageSection
    from ..spec.storage_url import credential_problems

    data = config.storage.model_dump()
    if url:
        data["url"] = url
    if not data.get("url"):
        raise UsageError(f"give the mirror's URL ({how}) or set [storage] url in config.toml")
    # Each line names where the value came from: the URL typed on the command line, else the file.
    where = f"{config.path}: " if config.path else ""
    given = f"the URL {url!r}: " if url else f"{where}storage.url: "

    def named(field: str, text: str) -> str:
        return given + text if field == "url" else f"{where}storage.{field}: {text}"

    try:
        section = StorageSection.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(
            [named(".".join(map(str, e["loc"])), e["msg"].removeprefix("Value error, ")) for e in exc.errors()]
        ) from None
    from ..objectstore.signing import key_problems

    environ: Mapping[str, str] = os.environ if env is None else env
    problems = credential_problems(section, environ) + [where + p for p in key_problems(section, environ)]
    if problems:
        raise ConfigError(problems)
    if must_exist:
        _refuse_a_missing_folder(str(section.url))
    return section


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
    keys: Optional[Keys] = None,
    gpus: Optional[int] = None,
    available: Optional[Callable[[], int]] = None,
) -> Plan:
    """Everything that can refuse a job without touching the mirror, the store or the disk.
    `gpus`: `--gpus N`; `available`: the GPUs this machine hands out, asked only when needed (a job
    asking for more resumes on fewer when its `min_gpus` allows)."""
    if cand.manifest is None:
        raise Rejected(cand.problem)
    m, label = cand.manifest, cand.label
    if cand.untrusted:  # (--force never overrides it: the bucket key is the only proof of who wrote it)
        raise Untrusted(
            f"{label}: not adopted: its manifest in the mirror is not trusted: {cand.untrusted}",
            f"{cand.uid}:untrusted:{cand.content}",
        )
    local = store.by_uid(cand.uid)
    if local is not None:
        raise Refused(f"{label} is already in this store as job {local.id}")
    if m["state"] not in ADOPTABLE:
        raise Refused(f"{label} is {m['state']}: only queued, running or stopped jobs are adopted")
    own = m.get("owner") or {}
    holder = None if own.get("home_id") == home_id else mf.lease_holder(m, now, section.stale_after_minutes * 60)
    if holder and not force:
        raise Held(
            f"{label} is still owned by {holder}; stop its daemon there (`orch daemon stop` releases it), "
            "wait until the heartbeat is stale (`orch adopt --wait`), or adopt with --force if that machine is gone",
            cand.uid,
            str(own.get("home_id") or ""),
        )
    found, to_fetch, problems = datafiles.plan(list(m["data_files"]), mapping)
    if problems:
        raise Refused(f"{label}: its input files are not on this machine:\n  " + "\n  ".join(problems))
    resized, note = gpu_count(cand, gpus, available)
    return Plan(cand, found, to_fetch, keys, resized, note)


def gpu_count(
    cand: Candidate, gpus: Optional[int], available: Optional[Callable[[], int]]
) -> tuple[Optional[dict[str, Any]], str]:
    """The job's spec on the GPUs it will have here (None: as it asks) and a warning, or a refusal:
    `--gpus N` that cannot keep the effective batch (exit 2); a machine with fewer GPUs than
    `min_gpus` allows, or none keeping the effective batch."""
    m = cand.manifest or {}
    old = int(m.get("gpus") or 0)
    sizes = m.get("batch") if isinstance(m.get("batch"), dict) else None
    here = available() if gpus is None and available is not None and old > 0 else None
    if gpus is None and here is not None and old > here:
        gpus, why = fewer_gpus_allowed(m["spec"], kind=str(m["kind"]), old_gpus=old, available=here, sizes=sizes)
        if gpus is None:
            if m["spec"].get("min_gpus") is not None:
                raise Refused(f"{cand.label}: not adopted: {why}")
            return None, (
                f"note: {cand.label} {why}: this machine's daemon cannot start it "
                f"(`orch adopt --gpus {here}` resumes it on {here})"
            )
    if gpus is None or gpus == old:
        return None, ""
    try:
        spec = resized_spec(
            m["spec"], kind=str(m["kind"]), old_gpus=old, gpus=gpus, sizes=sizes, who=cand.label, command="orch adopt"
        )
    except UsageError as exc:
        raise Rejected(str(exc)) from None
    return spec, ""


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
        gpus = f"{m['gpus']} GPU" if p.resized is None else f"{p.gpus} GPU, was {m['gpus']}: checkpoint resharded"
        lines.append(f"  {p.cand.uid[:12]}  {m['name']}  [{m['kind']}, {m['state']}, {gpus}]")
        lines.append(f"      {what_it_runs(m)}")
        if m["spec"].get("env"):
            lines.append(f"      env: {', '.join(sorted(m['spec']['env']))}")
    return lines


def _refuse_a_missing_folder(url: str) -> None:
    from pathlib import Path

    from ..model.errors import BadInput
    from ..spec.storage_url import parse_storage_url

    parsed = parse_storage_url(url)
    if parsed.scheme == "file" and not Path(parsed.prefix).is_dir():
        raise BadInput(
            f"the mirror folder {parsed.prefix} ({url}) does not exist: check the path, or mount the disk that holds it"
        )
