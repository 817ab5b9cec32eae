"""`orch launch`'s use case: the first machine too. The job file is checked as `orch submit`
checks it (the caller's check: the same code, the same refusals, exit 2), then written straight
into the bucket as a queued job no machine holds yet, and this home remembers that it put it
there -- the record `orch watch` in this home needs before it pays for a machine for a job no
machine ever held (the bucket is untrusted: docs/security.md). `orch watch` then places it on the
market its policy picks; that machine adopts it and runs it."""

from __future__ import annotations

import os
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from ..model.errors import SpecError

ANY_SIZE = 1 << 16  # the machine is launched for the job: no local GPU count to check it against


@dataclass(frozen=True)
class Launched:
    uid: str
    name: str
    url: str


def launch_job(
    config: Any,
    store: Any,
    job_toml: Path,
    section: Any,
    deadline: Optional[str],
    now: float,
    check: Callable[[Path, float], None],
) -> Launched:
    """Check the job file (`check`, then a deadline against the estimate), build its manifest and
    put it into the bucket `section` names ([storage], or --url's). `deadline` (ISO time with a
    zone) overrides the file's."""
    from ..objectstore.remote import Remote
    from ..objectstore.signing import keys_from

    with _with_deadline(job_toml, deadline) as path:
        check(path, now)
        _deadline_within_estimate(store, path, job_toml, now)
        manifest = _manifest(config, path, job_toml, now)
    remote = Remote(section)
    put_launched(store, remote, manifest, now, keys_from(section, os.environ))
    return Launched(uid=manifest["uid"], name=manifest["name"], url=remote.url.raw)


def _deadline_within_estimate(store: Any, path: Path, original: Path, now: float) -> None:
    """A deadline nearer than the job's estimate -- the mean run time of the finished jobs of its
    name in this home, where there are any -- cannot be met even on on-demand: refused (exit 2)."""
    from ..model.states import JobState
    from ..planning.forecast import history_of
    from ..spec.jobspec import load_jobspec

    spec = load_jobspec(path)
    when = spec.deadline_ts
    if when is None:
        return
    history = history_of(store.jobs([JobState.SUCCEEDED]), spec.name or "")
    if history is None or when - now >= history.seconds:
        return
    raise SpecError(
        [
            f"{original}: deadline: {spec.deadline} is {(when - now) / 3600:.2f} h away, shorter than the job's "
            f"estimate of {history.seconds / 3600:.2f} h (the mean of {history.runs} finished job(s) named "
            f"{spec.name!r} here): it cannot be met even on on-demand"
        ]
    )


def put_launched(store: Any, remote: Any, manifest: dict[str, Any], now: float, keys: Any = None) -> None:
    """Remember the job as this home's (first: a crash between the two leaves a record for
    nothing, never a job in the bucket `orch watch` here refuses), then create its manifest,
    signed with the bucket key where [storage] names one (`orch watch` anywhere then trusts it)."""
    from ..objectstore import manifest as mf
    from ..objectstore import signing
    from .controller import launch_key

    store.recovery_mark(launch_key(manifest["uid"]), now)
    remote.cas_put(mf.manifest_key(manifest["uid"]), mf.dump(signing.sign(manifest, keys)), None)


def _manifest(config: Any, path: Path, original: Path, now: float) -> dict[str, Any]:
    """The job's manifest as a daemon would write it for a queued job, built by `orch submit`'s
    own code in a scratch home, with no lease: no machine holds it yet."""
    from ..home.paths import Home
    from ..jobs.lifecycle import submit_job
    from ..objectstore import manifest as mf
    from ..store import Store

    with tempfile.TemporaryDirectory(prefix="orch-launch-") as scratch:
        home = Home(Path(scratch)).ensure()
        scratch_store = Store(home.db)
        try:
            job = submit_job(scratch_store, config, home, path, now=now, machine_gpus=ANY_SIZE)
            manifest = mf.build_manifest(
                job, scratch_store.attempts(job.id), home_id="", checkpoints=[], batch=None, progress=None, now=now
            )
        finally:
            scratch_store.close()
    manifest["owner"] = {"host": socket.gethostname(), "by": "orch launch", "released": False}
    manifest["spec_path"] = str(original.resolve())
    return manifest


class _with_deadline:
    """The job file itself, or (with --deadline) a copy beside it with the deadline set, so
    relative paths in it mean the same; the copy is removed after."""

    def __init__(self, job_toml: Path, deadline: Optional[str]):
        self.job_toml, self.deadline = job_toml, deadline
        self.copy: Optional[Path] = None

    def __enter__(self) -> Path:
        if self.deadline is None:
            return self.job_toml
        import tomli_w

        from ..spec.tomlfile import read_toml

        data = read_toml(self.job_toml, str(self.job_toml), SpecError)  # submit's own reading, refusals
        data["deadline"] = self.deadline
        data.setdefault("name", self.job_toml.stem)
        fd, name = tempfile.mkstemp(prefix=f".{self.job_toml.stem}-", suffix=".toml", dir=self.job_toml.parent)
        with os.fdopen(fd, "w") as f:
            f.write(tomli_w.dumps(data))
        self.copy = Path(name)
        return self.copy

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        if self.copy is None:
            return
        self.copy.unlink(missing_ok=True)
        if isinstance(exc, SpecError):  # the problems name the user's file, not the copy
            exc.problems = [p.replace(str(self.copy), f"{self.job_toml} (with --deadline)") for p in exc.problems]
            exc.args = ("\n".join(exc.problems),)
