"""A small PNG of a run's loss curve for end-of-job messages, drawn from metrics.csv with the
standard library only (zlib + struct): train_loss and val_loss against the step, the axes' ends
labelled with a built-in 5x7 pixel font. Rendered at delivery time, in the daemon, never with
torch or matplotlib; a run without a loss column gives no picture."""

from __future__ import annotations

import math
import struct
import zlib
from typing import Mapping, Optional, Sequence


WIDTH, HEIGHT = 480, 240
MARGIN_L, MARGIN_R, MARGIN_T, MARGIN_B = 52, 12, 22, 22
WHITE, GRID, AXIS, TEXT = (255, 255, 255), (228, 228, 228), (120, 120, 120), (40, 40, 40)
COLORS = {"train_loss": (31, 119, 180), "val_loss": (255, 127, 14)}
CURVES = ("train_loss", "val_loss")

_FONT = {  # 5x7, one string per row, '#' = ink
    "0": [".###.", "#...#", "#..##", "#.#.#", "##..#", "#...#", ".###."],
    "1": ["..#..", ".##..", "..#..", "..#..", "..#..", "..#..", ".###."],
    "2": [".###.", "#...#", "....#", "...#.", "..#..", ".#...", "#####"],
    "3": ["####.", "....#", "....#", ".###.", "....#", "....#", "####."],
    "4": ["...#.", "..##.", ".#.#.", "#..#.", "#####", "...#.", "...#."],
    "5": ["#####", "#....", "####.", "....#", "....#", "#...#", ".###."],
    "6": [".###.", "#....", "#....", "####.", "#...#", "#...#", ".###."],
    "7": ["#####", "....#", "...#.", "..#..", ".#...", ".#...", ".#..."],
    "8": [".###.", "#...#", "#...#", ".###.", "#...#", "#...#", ".###."],
    "9": [".###.", "#...#", "#...#", ".####", "....#", "....#", ".###."],
    ".": [".....", ".....", ".....", ".....", ".....", ".##..", ".##.."],
    "-": [".....", ".....", ".....", "#####", ".....", ".....", "....."],
    "+": [".....", "..#..", "..#..", "#####", "..#..", "..#..", "....."],
    "_": [".....", ".....", ".....", ".....", ".....", ".....", "#####"],
    " ": [".....", ".....", ".....", ".....", ".....", ".....", "....."],
    "a": [".....", ".....", ".###.", "....#", ".####", "#...#", ".####"],
    "e": [".....", ".....", ".###.", "#...#", "#####", "#....", ".###."],
    "i": ["..#..", ".....", ".##..", "..#..", "..#..", "..#..", ".###."],
    "k": ["#....", "#....", "#..#.", "#.#..", "##...", "#.#..", "#..#."],
    "l": [".##..", "..#..", "..#..", "..#..", "..#..", "..#..", ".###."],
    "n": [".....", ".....", "####.", "#...#", "#...#", "#...#", "#...#"],
    "o": [".....", ".....", ".###.", "#...#", "#...#", "#...#", ".###."],
    "p": [".....", ".....", "####.", "#...#", "####.", "#....", "#...."],
    "r": [".....", ".....", "#.##.", "##..#", "#....", "#....", "#...."],
    "s": [".....", ".....", ".####", "#....", ".###.", "....#", "####."],
    "t": [".#...", ".#...", "####.", ".#...", ".#...", ".#..#", "..##."],
    "v": [".....", ".....", "#...#", "#...#", "#...#", ".#.#.", "..#.."],
    "M": ["#...#", "##.##", "#.#.#", "#.#.#", "#...#", "#...#", "#...#"],
}


class Canvas:
    def __init__(self, width: int, height: int, background: tuple[int, int, int] = WHITE):
        self.width, self.height = width, height
        self.pixels = bytearray(bytes(background) * (width * height))

    def set(self, x: int, y: int, color: tuple[int, int, int]) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            i = (y * self.width + x) * 3
            self.pixels[i : i + 3] = bytes(color)

    def line(self, x0: int, y0: int, x1: int, y1: int, color: tuple[int, int, int], thick: int = 1) -> None:
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err = dx + dy
        while True:
            for ox in range(thick):
                for oy in range(thick):
                    self.set(x0 + ox, y0 + oy, color)
            if x0 == x1 and y0 == y1:
                return
            e2 = 2 * err
            if e2 >= dy:
                err += dy
                x0 += sx
            if e2 <= dx:
                err += dx
                y0 += sy

    def text(self, x: int, y: int, text: str, color: tuple[int, int, int] = TEXT) -> int:
        """Draws at (x, y) = top left; returns the x after the text."""
        for ch in text:
            glyph = _FONT.get(ch) or _FONT.get(ch.lower()) or _FONT[" "]
            for row, bits in enumerate(glyph):
                for col, bit in enumerate(bits):
                    if bit == "#":
                        self.set(x + col, y + row, color)
            x += 6
        return x

    def png(self) -> bytes:
        raw = b"".join(
            b"\x00" + bytes(self.pixels[y * self.width * 3 : (y + 1) * self.width * 3]) for y in range(self.height)
        )
        return encode_png(self.width, self.height, raw)


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def encode_png(width: int, height: int, filtered_rows: bytes) -> bytes:
    """An 8-bit RGB PNG from rows that each start with their filter byte."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(filtered_rows, 9))
        + _chunk(b"IEND", b"")
    )


def _label(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1e6:
        return f"{value / 1e6:.3g}M"
    if abs(value) >= 1e4:
        return f"{value / 1e3:.3g}k"
    return f"{value:.4g}"


def draw_curves(
    series: Mapping[str, Sequence[Sequence[Optional[float]]]],
    names: Sequence[str] = CURVES,
    width: int = WIDTH,
    height: int = HEIGHT,
) -> Optional[bytes]:
    """PNG bytes of the named series ([[step, value], ...]), or None when none has a point."""
    points = {
        n: [(float(s or 0), float(v)) for s, v in series.get(n, []) if v is not None and math.isfinite(v)]
        for n in names
    }
    points = {n: p for n, p in points.items() if p}
    if not points:
        return None
    xs = [x for p in points.values() for x, _ in p]
    ys = [y for p in points.values() for _, y in p]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        y0, y1 = y0 - abs(y0) * 0.05 - 1e-9, y1 + abs(y1) * 0.05 + 1e-9
    pad = (y1 - y0) * 0.05
    y0, y1 = y0 - pad, y1 + pad
    c = Canvas(width, height)
    left, right, top, bottom = MARGIN_L, width - MARGIN_R, MARGIN_T, height - MARGIN_B

    def px(x: float) -> int:
        return round(left + (x - x0) / (x1 - x0) * (right - left))

    def py(y: float) -> int:
        return round(bottom - (y - y0) / (y1 - y0) * (bottom - top))

    for i in range(5):  # horizontal grid lines
        gy = round(top + i * (bottom - top) / 4)
        c.line(left, gy, right, gy, GRID)
    c.line(left, top, left, bottom, AXIS)
    c.line(left, bottom, right, bottom, AXIS)
    c.text(2, top - 3, _label(y1)[:8])
    c.text(2, bottom - 4, _label(y0)[:8])
    c.text(left, bottom + 6, _label(x0))
    end = "step " + _label(x1)
    c.text(right - 6 * len(end), bottom + 6, end)
    x = left
    for name, pts in points.items():
        color = COLORS.get(name, (44, 160, 44))
        c.line(x, 9, x + 12, 9, color, thick=2)
        x = c.text(x + 16, 6, name, color) + 10
        for (ax, ay), (bx, by) in zip(pts, pts[1:]):
            c.line(px(ax), py(ay), px(bx), py(by), color, thick=2)
        if len(pts) == 1:
            c.line(px(pts[0][0]) - 2, py(pts[0][1]), px(pts[0][0]) + 2, py(pts[0][1]), color, thick=3)
    return c.png()
