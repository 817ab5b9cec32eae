"""`orch storage check`: can this machine reach [storage], and fast enough? Writes, reads,
conditionally writes and deletes a probe object, times an upload, and says whether the newest
local checkpoint would fit in the notice window at that speed."""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Optional


def newest_local_checkpoint(home: Any) -> Optional[Path]:
    from ..contract import checkpoint_dir, step_checkpoints

    best: Optional[tuple[float, Path]] = None
    if not home.runs.is_dir():
        return None
    for run in home.runs.iterdir():
        for path, _ in step_checkpoints(checkpoint_dir(run))[:1]:
            try:
                mtime = path.stat().st_mtime
            except OSError:
                continue
            if best is None or mtime > best[0]:
                best = (mtime, path)
    return best[1] if best else None


def check_storage(home: Any, config: Any, url: Optional[str], probe_mb: float, say: Callable[[str], None]) -> int:
    from ..adopt import storage_for
    from ..objectstore.remote import Conflict, Remote, StorageError

    section = storage_for(config, url)
    remote = Remote(section)
    key = f"probe/{uuid.uuid4().hex}"
    say(f"storage: {section.url}" + (f" (endpoint {section.endpoint})" if section.endpoint else ""))
    try:
        t = time.monotonic()
        etag = remote.cas_put(key, b"orch probe 1", None)
        say(f"  conditional create: ok ({(time.monotonic() - t) * 1000:.0f} ms)")
        if remote.get_bytes(key) != b"orch probe 1":
            say("  read back: FAILED (different content)")
            return 1
        say("  read back: ok")
        etag2 = remote.cas_put(key, b"orch probe 2", etag)
        try:
            remote.cas_put(key, b"orch probe 3", etag)
            say(
                "  conditional update: FAILED (a write with a stale ETag was accepted: two machines could both think "
                "they own a job; orch relies on the lease alone here)"
            )
        except Conflict:
            say("  conditional update: ok (a stale ETag is refused)")
        del etag2
        size = int(probe_mb * 1024 * 1024)
        with tempfile.NamedTemporaryFile(prefix="orch-probe-", delete=False) as f:
            f.write(os.urandom(size))
            probe = Path(f.name)
        try:
            t = time.monotonic()
            remote.put_file(key + ".bin", probe, concurrency=section.notice_concurrency)
            took = time.monotonic() - t
        finally:
            probe.unlink(missing_ok=True)
        rate = size / took if took > 0 else float("inf")
        say(
            f"  upload of {probe_mb:g} MB: {took:.2f} s ({rate / 1e6:.1f} MB/s at notice_concurrency "
            f"{section.notice_concurrency})"
        )
        remote.delete(key + ".bin")
        remote.delete(key)
        if remote.get_bytes(key) is not None:
            say("  delete: FAILED (the probe is still there)")
            return 1
        say("  delete: ok")
    except StorageError as exc:
        say(f"  FAILED: {exc}")
        return 1
    newest = newest_local_checkpoint(home)
    if newest is not None:
        need = newest.stat().st_size / rate
        fits = need <= section.notice_deadline_seconds
        say(
            f"  newest checkpoint here: {newest.name} ({newest.stat().st_size / 1e6:.0f} MB): about {need:.0f} s to upload, "
            + (
                f"inside the {section.notice_deadline_seconds:g} s notice window"
                if fits
                else f"MORE than the {section.notice_deadline_seconds:g} s notice window: the periodic uploads are what "
                "protect these jobs; checkpoint more often or use a bucket in the same region"
            )
        )
    say(
        "  reminder: add a bucket lifecycle rule that aborts incomplete multipart uploads (a killed upload leaves "
        "invisible, billed parts behind)"
    )
    return 0
