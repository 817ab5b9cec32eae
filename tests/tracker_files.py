"""Reading what the trackers wrote locally, for the tracking tests: W&B's offline .wandb files and
SwanLab's offline .swanlab files (both LevelDB-log framed protobuf records), MLflow's file store
through its own client."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Iterator

_BLOCK, _HEADER = 32768, 7


def leveldb_records(path: Path) -> Iterator[bytes]:
    """The records of a LevelDB-log file (a 7-byte file header, then 32 KiB blocks of framed
    chunks: crc32, length, type 1 full / 2 first / 3 middle / 4 last)."""
    raw = Path(path).read_bytes()
    pos, pending = _HEADER, b""
    while pos + _HEADER <= len(raw):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", raw[pos : pos + _HEADER])
        if kind == 0 and length == 0:  # zero padding at a block's end
            pos += left
            continue
        data = raw[pos + _HEADER : pos + _HEADER + length]
        pos += _HEADER + length
        if kind == 1:
            yield data
        elif kind == 2:
            pending = data
        elif kind == 3:
            pending += data
        elif kind == 4:
            yield pending + data
            pending = b""


def wandb_attempts(folder: Path) -> list[dict[str, Any]]:
    """Per offline attempt folder (oldest first): run id, history rows, exit code, whether it
    was marked preempting, its notes."""
    from wandb.proto import wandb_internal_pb2 as pb

    out = []
    for f in sorted(Path(folder).glob("offline-run-*/run-*.wandb")):
        got: dict[str, Any] = {"rows": [], "exit": None, "preempting": False, "run_id": None, "notes": ""}
        for data in leveldb_records(f):
            r = pb.Record()
            r.ParseFromString(data)
            kind = r.WhichOneof("record_type")
            if kind == "history":
                got["rows"].append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item})
            elif kind == "exit":
                got["exit"] = r.exit.exit_code
            elif kind == "preempting":
                got["preempting"] = True
            elif kind == "run":
                got["run_id"] = r.run.run_id or got["run_id"]
                got["notes"] = r.run.notes or got["notes"]
        out.append(got)
    return out


def swanlab_attempts(folder: Path) -> list[dict[str, Any]]:
    """Per offline attempt folder (oldest first): run id, {metric key: [steps]}, finish state."""
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record

    out = []
    for f in sorted(Path(folder).glob("run-*/run-*.swanlab")):
        got: dict[str, Any] = {"steps": {}, "finish": None, "run_id": f.stem[len("run-") :], "kinds": set()}
        for data in leveldb_records(f):
            r = Record()
            r.ParseFromString(data)
            kind = r.WhichOneof("record_type")
            got["kinds"].add(kind)
            if kind == "finish":
                got["finish"] = r.finish.state
            elif kind == "start":
                got["run_id"] = r.start.id or got["run_id"]
            elif kind == "scalar":
                got["steps"].setdefault(r.scalar.key, []).append(r.scalar.step)
        out.append(got)
    return out
