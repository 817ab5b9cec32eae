"""config.example.toml at the repository root: it validates, and it names every key of every
config.toml section (set to its default, or commented out), so it cannot fall behind the code."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from pydantic import BaseModel

from orchestrator.spec.config import Config, load_config

EXAMPLE = Path(__file__).resolve().parents[2] / "config.example.toml"
_SECTION = re.compile(r"^\s*#?\s*\[(\w+)\]\s*(#.*)?$")
_KEY = re.compile(r"^\s*#?\s*(\w+)\s*=")


def _keys_by_section(text: str) -> dict[str, set[str]]:
    """Keys per [section], set or commented out ("# key = ..."); [[notifiers]] tables are skipped."""
    found: dict[str, set[str]] = {}
    section = None
    for line in text.splitlines():
        if re.match(r"^\s*#?\s*\[\[", line):
            section = None
            continue
        m = _SECTION.match(line)
        if m:
            section = m.group(1)
            found.setdefault(section, set())
            continue
        m = _KEY.match(line)
        if m and section:
            found[section].add(m.group(1))
    return found


def test_the_example_config_validates_through_the_cli():
    res = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "config", "check", str(EXAMPLE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert f"{EXAMPLE}: ok" in res.stdout


def test_the_example_config_loads_to_the_defaults_of_each_key_it_sets():
    loaded, defaults = load_config(EXAMPLE, required=True), Config()
    for name in ("daemon", "pricing", "preemption", "idle", "notify"):
        assert getattr(loaded, name) == getattr(defaults, name), f"[{name}] in config.example.toml is not the default"


def test_the_example_config_names_every_key_of_every_section():
    found = _keys_by_section(EXAMPLE.read_text())
    missing = []
    for name, field in Config.model_fields.items():
        model = field.annotation
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            continue  # notifiers: a list of tables, shown commented out per type
        for key in model.model_fields:
            if key not in found.get(name, set()):
                missing.append(f"[{name}] {key}")
    assert not missing, "config.example.toml lacks: " + ", ".join(missing)
    assert "notifiers" in EXAMPLE.read_text()
