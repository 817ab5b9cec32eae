"""TensorBoard event files without TensorFlow, tensorboard or protobuf: TFRecord framing (length,
masked CRC-32C, data, masked CRC-32C) around Event messages encoded by hand. Only what scalars
need: file_version, wall_time, step, Summary.Value{tag, simple_value} and SessionLog.START (the
mark TensorBoard reads as "discard every event from this step on": how a resumed attempt continues
a run instead of restarting it). Standard library only; the reader is here for tests and tools.

Wire format, from tensorflow/core/util/event.proto and summary.proto:
  Event:   1 wall_time (double), 2 step (int64), 3 file_version (string), 5 summary, 7 session_log
  Summary: 1 value (repeated Value);  Value: 1 tag (string), 2 simple_value (float)
  SessionLog: 1 status (enum: START = 1)
"""

from __future__ import annotations

import math
import os
import socket
import struct
import time
from pathlib import Path
from typing import Any, BinaryIO, Iterator, NamedTuple, Optional

FILE_PREFIX = "events.out.tfevents."
SESSION_START = 1


# -- CRC-32C (Castagnoli), as TFRecord masks it ---------------------------------------------------

def _crc_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    table = _TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame(data: bytes) -> bytes:
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", masked_crc(header)) + data + struct.pack("<I", masked_crc(data))


# -- protobuf, by hand ---------------------------------------------------------------------------

def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # int64: negatives as two's complement, 10 bytes
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _key(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


def _length_delimited(field: int, payload: bytes) -> bytes:
    return _key(field, 2) + _varint(len(payload)) + payload


def encode_event(*, wall_time: float, step: int = 0, file_version: Optional[str] = None,
                 scalars: Optional[dict[str, float]] = None, session_start: bool = False) -> bytes:
    out = _key(1, 1) + struct.pack("<d", wall_time)
    if step:
        out += _key(2, 0) + _varint(int(step))
    if file_version is not None:
        out += _length_delimited(3, file_version.encode())
    if scalars:
        values = b"".join(
            _length_delimited(1, _length_delimited(1, tag.encode()) + _key(2, 5) + struct.pack("<f", value))
            for tag, value in scalars.items())
        out += _length_delimited(5, values)
    if session_start:
        out += _length_delimited(7, _key(1, 0) + _varint(SESSION_START))
    return out


# -- writing -------------------------------------------------------------------------------------

class EventFileWriter:
    """One events file per process (per attempt). `purge_step`: the step this attempt resumes
    at; TensorBoard then drops what earlier attempts logged from that step on, so steps redone
    after a preemption are not drawn twice. Buffered; flushed every `flush_every_s` and on close."""

    def __init__(self, folder: str | Path, *, purge_step: Optional[int] = None, suffix: str = "",
                 flush_every_s: float = 2.0):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        name = f"{FILE_PREFIX}{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}"
        self.path = self.folder / (name + (f".{suffix}" if suffix else ""))
        self._fh: Optional[BinaryIO] = open(self.path, "ab")
        self.flush_every_s = flush_every_s
        self._last_flush = time.monotonic()
        self._write(encode_event(wall_time=time.time(), file_version="brain.Event:2"))
        if purge_step is not None:
            self._write(encode_event(wall_time=time.time(), step=purge_step, session_start=True))
        self.flush()

    def _write(self, event: bytes) -> None:
        if self._fh is None:
            raise ValueError(f"{self.path} is closed")
        self._fh.write(frame(event))

    def add_scalars(self, scalars: dict[str, float], step: int, wall_time: Optional[float] = None) -> None:
        """Several tags at one step in one Event (what TensorBoard's own writer does per tag is
        equivalent for its reader). Values that are not numbers are skipped."""
        clean = {}
        for tag, value in scalars.items():
            try:
                clean[str(tag)] = float(value)
            except (TypeError, ValueError):
                continue
        if not clean:
            return
        self._write(encode_event(wall_time=time.time() if wall_time is None else wall_time, step=step, scalars=clean))
        if time.monotonic() - self._last_flush >= self.flush_every_s:
            self.flush()

    def flush(self) -> None:
        if self._fh is not None:
            self._fh.flush()
            self._last_flush = time.monotonic()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.flush()
            try:
                os.fsync(self._fh.fileno())
            except OSError:
                pass
            self._fh.close()
            self._fh = None


# -- reading -------------------------------------------------------------------------------------

class Event(NamedTuple):
    wall_time: float
    step: int
    file_version: Optional[str]
    scalars: dict[str, float]
    session_start: bool


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            n, pos = _read_varint(buf, pos)
            value, pos = buf[pos:pos + n], pos + n
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield field, wire, value


def decode_event(data: bytes) -> Event:
    wall_time, step, version, scalars, start = 0.0, 0, None, {}, False
    for field, wire, value in _fields(data):
        if field == 1 and wire == 1:
            wall_time = struct.unpack("<d", value)[0]
        elif field == 2 and wire == 0:
            step = value - (1 << 64) if value >= 1 << 63 else value
        elif field == 3 and wire == 2:
            version = value.decode()
        elif field == 5 and wire == 2:
            for f, _, item in _fields(value):
                if f != 1:
                    continue
                tag, number = "", None
                for vf, vw, v in _fields(item):
                    if vf == 1 and vw == 2:
                        tag = v.decode()
                    elif vf == 2 and vw == 5:
                        number = struct.unpack("<f", v)[0]
                if number is not None:
                    scalars[tag] = number
        elif field == 7 and wire == 2:
            start = any(f == 1 and v == SESSION_START for f, _, v in _fields(value))
    return Event(wall_time, step, version, scalars, start)


def read_records(path: str | Path) -> Iterator[bytes]:
    """The records of one file, CRCs checked; a torn last record (a killed writer) ends it."""
    with open(path, "rb") as fh:
        while True:
            header = fh.read(12)
            if len(header) < 12:
                return
            (length,), (crc,) = struct.unpack("<Q", header[:8]), struct.unpack("<I", header[8:])
            if crc != masked_crc(header[:8]):
                raise ValueError(f"{path}: corrupt record header")
            data = fh.read(length)
            footer = fh.read(4)
            if len(data) < length or len(footer) < 4:
                return
            if struct.unpack("<I", footer)[0] != masked_crc(data):
                raise ValueError(f"{path}: corrupt record")
            yield data


def event_files(folder: str | Path) -> list[Path]:
    """In the order TensorBoard reads them: by name (the creation time is in it)."""
    return sorted(p for p in Path(folder).glob(FILE_PREFIX + "*") if p.is_file())


def read_scalars(folder: str | Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] as TensorBoard shows them: files in name order, and a SessionLog
    START at step S drops what came before it at steps >= S."""
    series: dict[str, list[tuple[int, float]]] = {}
    for path in event_files(folder):
        for record in read_records(path):
            event = decode_event(record)
            if event.session_start:
                for tag in series:
                    series[tag] = [(s, v) for s, v in series[tag] if s < event.step]
            for tag, value in event.scalars.items():
                series.setdefault(tag, []).append((event.step, value))
    return series


def same_value(a: float, b: float) -> bool:
    """A float32 event value against the CSV's float: equal to float32 precision (NaN == NaN)."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b or math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12)
