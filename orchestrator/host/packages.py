"""packages.txt, the first attempt's installed distributions, and what differs in a later
attempt's: which distributions changed (old -> new), and whether one of them is torch, a CUDA
library or a training library, which breaks the bit-exact resume promise."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Optional

PYTHON = "python"  # the interpreter's version, compared like a distribution
# A change of these (or of a CUDA library, nvidia-*) may change the numbers a resumed run computes.
BREAKING = frozenset(
    {
        PYTHON,
        "torch",
        "lightning",
        "pytorch-lightning",
        "lightning-fabric",
        "transformers",
        "accelerate",
        "peft",
        "deepspeed",
        "triton",
        "datasets",
        "tokenizers",
    }
)
_LISTED = 20  # changes named in one event; the rest are counted


def canonical(name: str) -> str:
    """PEP 503: `Foo_Bar` and `foo-bar` are one distribution."""
    return re.sub(r"[-_.]+", "-", name).lower()


def packages_text(python: str, packages: Mapping[str, str]) -> str:
    """`# python X.Y.Z`, then `name==version` per distribution, sorted by name."""
    lines = [f"# python {python}"] + [f"{k}=={v}" for k, v in sorted(packages.items(), key=lambda kv: canonical(kv[0]))]
    return "\n".join(lines) + "\n"


def parse_packages(text: str) -> dict[str, str]:
    """packages.txt back into {canonical name: version}; the Python version under "python"."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("# python "):
            out[PYTHON] = line[len("# python ") :].strip()
        elif line and not line.startswith("#") and "==" in line:
            name, _, version = line.partition("==")
            out[canonical(name)] = version.strip()
    return out


@dataclass(frozen=True)
class Change:
    name: str
    old: Optional[str]  # None: installed since
    new: Optional[str]  # None: removed since

    @property
    def breaking(self) -> bool:
        return self.name in BREAKING or self.name.startswith("nvidia-")

    def __str__(self) -> str:
        return f"{self.name} {self.old or '(absent)'} -> {self.new or '(removed)'}"


def changes(first: Mapping[str, str], now: Mapping[str, str]) -> list[Change]:
    """What differs, breaking ones first, then by name."""
    out = [Change(n, first.get(n), now.get(n)) for n in set(first) | set(now) if first.get(n) != now.get(n)]
    return sorted(out, key=lambda c: (not c.breaking, c.name))


def describe(found: list[Change], since: str) -> str:
    """The event's detail: what changed, old -> new, and whether exact resume still holds."""
    listed = ", ".join(map(str, found[:_LISTED]))
    more = f" and {len(found) - _LISTED} more" if len(found) > _LISTED else ""
    text = f"{len(found)} distribution{'s' if len(found) != 1 else ''} changed since {since}: {listed}{more}"
    breaking = [c.name for c in found if c.breaking]
    if breaking:
        text += (
            f". {', '.join(breaking)} changed: the resumed run may not compute the same numbers as the first "
            "(bit-exact resume is not guaranteed)"
        )
    return text
