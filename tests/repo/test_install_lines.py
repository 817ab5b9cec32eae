"""Every install line names our package, `orch-gpu` (issue 38, item 2): `orch` on the public index
is someone else's project, so `pip install 'orch[aws]'` or `'orch @ git+…'` installs the wrong
thing. Scans the docs, the examples, the scripts, the README and the messages in the code."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCANNED = ["docs", "examples", "scripts", "orchestrator", "training", "notifiers"]
TEXT_SUFFIXES = {".md", ".py", ".sh", ".toml", ".txt", ".yml", ".yaml", ".cfg", ""}

# `orch[extra]` or `orch @ <url>`: a requirement naming the package `orch`.
_WRONG_REQUIREMENT = re.compile(r"(?<![\w./-])orch(\[\w|\s*@\s*(git\+|https?:|file:))")
# `pip install orch` (bare, possibly quoted).
_WRONG_BARE = re.compile(r"pip3? install\s+(-U\s+|--upgrade\s+)?['\"]?orch(?![\w-])(?!\s*(watch|run|submit)\b)")


def _files() -> list[Path]:
    found = [REPO / "README.md", REPO / "config.example.toml"]
    for top in SCANNED:
        found += [p for p in (REPO / top).rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES]
    return [p for p in found if "__pycache__" not in p.parts]


def wrong_install_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if _WRONG_REQUIREMENT.search(line) or _WRONG_BARE.search(line)]


def test_the_scanner_catches_the_forms_a_new_user_copied():
    assert wrong_install_lines("pip install 'orch[aws]'")
    assert wrong_install_lines("package='orch @ git+https://github.com/YOU/orch@v0.1.0'")
    assert wrong_install_lines("pip install orch")
    assert not wrong_install_lines("pip install 'orch-gpu[aws]' && pip install orch-gpu")
    assert not wrong_install_lines("pip install 'orch-gpu @ git+https://github.com/YOU/orch@v0.1.0'")
    assert not wrong_install_lines("pip install -e '.[docs]'   # then run orch submit")


def test_every_install_line_names_orch_gpu():
    problems = []
    for path in _files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        problems += [f"{path.relative_to(REPO)}: {line}" for line in wrong_install_lines(text)]
    assert not problems, "install lines naming the wrong package (use orch-gpu):\n" + "\n".join(problems)
