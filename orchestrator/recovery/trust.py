"""The controller's verify gate: may `orch watch` act on this manifest at all (launch for it, stop a
machine because of it)? The bucket is untrusted (docs/security.md), so a manifest is acted on only

  with a bucket key ([storage] signing_key_env): when its signature verifies, and it is not older
    than one of the same job this controller already trusted (an old, genuinely signed copy put
    back -- a replayed lease -- would otherwise make a live job look lost);
  without one: when `orch launch` from this controller's home put the job in the bucket (a record
    in this home's store, which the bucket cannot forge) -- the machines this controller launches
    are launched for such jobs only.

Everything else is reported once per job and content (`untrusted`) and never launched."""

from __future__ import annotations

import json
import time
from typing import Any, Optional

from ..objectstore import signing
from ..objectstore.signing import Keys
from .jobview import launch_key


def _newest_key(uid: str) -> str:
    return f"written:{uid}"


class TrustGate:
    def __init__(self, store: Any, keys: Optional[Keys]):
        self.store, self.keys = store, keys
        self._seen: dict[str, tuple[bytes, Optional[str]]] = {}  # uid -> (bytes, the verdict on them)

    def start_line(self) -> str:
        """What `orch watch` says at start about what it trusts."""
        if self.keys is not None:
            return (
                f"launching only jobs whose manifests are signed with the bucket key in "
                f"${self.keys.env_name} (key id {self.keys.signing_id})"
            )
        return (
            "no bucket key ([storage] signing_key_env): launching only jobs `orch launch` put in the bucket "
            "from this home; set a key on this controller and the machines to recover jobs submitted elsewhere "
            "(docs/security.md)"
        )

    def problem(self, uid: str, raw: bytes) -> Optional[str]:
        """Why the manifest `raw` of job `uid` is not trusted, or None when it is. Its bytes were
        already checked as a manifest (manifest_model.parse)."""
        held = self._seen.get(uid)
        if held is not None and held[0] == raw:
            return held[1]
        verdict = self._judge(uid, raw)
        self._seen[uid] = (raw, verdict)
        return verdict

    def _judge(self, uid: str, raw: bytes) -> Optional[str]:
        if self.keys is None:
            if self.store.recovery_marked(launch_key(uid)):
                return None
            return (
                "it was not put in the bucket by `orch launch` from this home, and no bucket key is set "
                "([storage] signing_key_env) to verify where it came from"
            )
        data = json.loads(raw.decode("utf-8"))
        bad = signing.problem(data, self.keys)
        if bad:
            return bad
        written = data.get("written_at")
        if not isinstance(written, (int, float)) or isinstance(written, bool):
            return None
        before = self.store.recovery_newest(_newest_key(uid), float(written))
        if before is not None and written < before:
            return (
                f"it is an older copy (written {_when(written)}) than one this controller already read "
                f"(written {_when(before)}): an old manifest put back, its lease replayed"
            )
        return None


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))
