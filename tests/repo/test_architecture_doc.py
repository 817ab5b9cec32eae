"""docs/architecture.md is the map of the code: every module of orchestrator/ is named on it and
every module it names exists, and its table of processes names every entry point a process is
started from (a module run with `python -m`, or the `orch` verbs that run as long-lived
processes). A module added, moved or removed without the page fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "architecture.md").read_text()
SKIP = {"__init__.py", "__main__.py"}


def named_modules() -> set[str]:
    """The file names the page writes as `something.py` (a path or a bare name)."""
    return {name.rsplit("/", 1)[-1] for name in re.findall(r"`([\w/.]+\.py)`", DOC)}


def process_table() -> str:
    start = DOC.index("| process | started as | owns |")
    return DOC[start : DOC.index("\n\n", start)]


@pytest.mark.parametrize("package", ["orchestrator", "notifiers"])
def test_every_module_of_the_tree_is_on_the_page(package):
    missing = sorted(
        str(p.relative_to(REPO))
        for p in (REPO / package).rglob("*.py")
        if p.name not in SKIP and p.name not in named_modules()
    )
    assert missing == [], f"modules docs/architecture.md does not name: {missing}"


def test_modules_of_one_room_that_share_a_name_are_named_with_their_folder():
    """executors/slurm/watch.py and executors/ray/watch.py: the page says which (`ray/watch.py`)."""
    named = set(re.findall(r"`([\w/.]+\.py)`", DOC))
    rooms: dict[tuple[str, str], list[Path]] = {}
    for p in (REPO / "orchestrator").rglob("*.py"):
        parts = p.relative_to(REPO / "orchestrator").parts
        if p.name not in SKIP and len(parts) > 1:
            rooms.setdefault((parts[0], p.name), []).append(p)
    unclear = sorted(
        str(p.relative_to(REPO))
        for same in rooms.values()
        if len(same) > 1
        for p in same
        if not any(n == f"{p.parent.name}/{p.name}" or n.endswith(f"/{p.parent.name}/{p.name}") for n in named)
    )
    assert unclear == [], f"modules docs/architecture.md names without their folder: {unclear}"


def test_every_module_the_page_names_exists():
    tree = {p.name for root in ("orchestrator", "training", "notifiers", "tools") for p in (REPO / root).rglob("*.py")}
    tree |= {p.name for root in ("benchmarks", "tests") for p in (REPO / root).rglob("*.py")}
    assert sorted(named_modules() - tree) == []


def test_the_process_table_names_every_entry_point():
    table = process_table()
    entry = [
        p
        for root in ("orchestrator", "training")
        for p in (REPO / root).rglob("*.py")
        if 'if __name__ == "__main__"' in p.read_text() and p.parent.name not in ("ahead",)  # doors re-export ahead/
    ]
    dotted = {".".join(p.relative_to(REPO).with_suffix("").parts) for p in entry}
    dotted = {"orchestrator.cli" if d == "orchestrator.cli.app" else d for d in dotted}
    missing = sorted(d for d in dotted if f"python -m {d}" not in table)
    assert missing == [], f"entry points the process table does not name: {missing}"
    for verb in ("orch daemon run", "orch run", "orch watch", "orch dashboard"):
        assert f"`{verb}" in table, verb
