"""The documentation cannot drift from the code: the job.toml and config.toml reference pages name
every key of the pydantic models with its default (and no key the models lack), every `orch`
command and flag the docs show exists, the README stays a landing page whose links resolve, and
the mkdocs site builds with --strict (no broken link or anchor)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import typing
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

import pytest
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from orchestrator.spec.config import Config
from orchestrator.spec.jobspec import JobSpec

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
README = REPO / "README.md"
REQUIRED, NOT_SET = object(), None
_HEADING = re.compile(r"^#{2,3} ")
_SECTION = re.compile(r"`\[(\w+(?:\.\w+)?)\]`")
_CHANNEL = re.compile(r'`type = "(\w+)"`')
_ROW = re.compile(r"^\| `(\w+)` \|[^|]*\| ([^|]+) \|")


def _tables(page: Path) -> dict[str, dict[str, Any]]:
    """{section: {key: default}} from a reference page: a `## [name]` heading starts a section
    (`## Top-level keys` the top level, `### type = "x"` a notifier type) and each table row
    `| `key` | type | default | meaning |` documents one key; the default is `required`,
    `not set`, or a TOML value in backticks."""
    found: dict[str, dict[str, Any]] = {}
    section: Optional[str] = None
    for line in page.read_text().splitlines():
        if _HEADING.match(line):
            if m := _CHANNEL.search(line):
                section = f"notifiers.{m.group(1)}"
            elif m := _SECTION.search(line):
                section = m.group(1)
            elif "[[notifiers]]" in line:
                section = "notifiers"
            elif "Top-level keys" in line:
                section = ""
            else:
                section = None
            continue
        m = _ROW.match(line)
        if not m or section is None:
            continue
        key, cell = m.group(1), m.group(2).strip()
        assert key not in found.setdefault(section, {}), f"{page.name}: [{section}] {key} documented twice"
        found[section][key] = _default(cell, f"{page.name}: [{section}] {key}")
    return found


def _default(cell: str, where: str) -> Any:
    if cell == "required":
        return REQUIRED
    if cell == "not set":
        return NOT_SET
    m = re.fullmatch(r"`(.+)`", cell)
    assert m, f"{where}: the default must be `required`, `not set` or a TOML value in backticks (got {cell!r})"
    return tomllib.loads(f"v = {m.group(1)}")["v"]


def _model_default(field) -> Any:
    if field.default_factory is not None:
        return field.default_factory()
    if field.default is PydanticUndefined:
        return REQUIRED
    return field.default


def _section_model(annotation) -> Optional[type[BaseModel]]:
    for a in (annotation, *typing.get_args(annotation)):
        if isinstance(a, type) and issubclass(a, BaseModel):
            return a
    return None


def _expected(model: type[BaseModel]) -> dict[str, dict[str, Any]]:
    """{section: {key: default}} of a model whose sub-models are sections; "" is the top level."""
    out: dict[str, dict[str, Any]] = {}
    for name, field in model.model_fields.items():
        if field.exclude:
            continue  # set by the loader, not read from the file
        sub = _section_model(field.annotation)
        if sub is None:
            out.setdefault("", {})[name] = _model_default(field)
        else:
            out[name] = {}
            for k, f in sub.model_fields.items():
                nested = _section_model(f.annotation)
                if nested is None:
                    out[name][k] = _model_default(f)
                else:  # a subtable ([recovery.aws]): its own section
                    out[f"{name}.{k}"] = {kk: _model_default(ff) for kk, ff in nested.model_fields.items()}
    return out


def _compare(documented: dict[str, dict[str, Any]], expected: dict[str, dict[str, Any]], page: str) -> None:
    problems = []
    for section, keys in expected.items():
        shown = documented.get(section, {})
        for key, default in keys.items():
            label = f"[{section}] {key}" if section else key
            if key not in shown:
                problems.append(f"{page} lacks {label}")
            elif not _same(shown[key], default):
                problems.append(f"{page}: {label} documented with default {shown[key]!r}, the model says {default!r}")
        for key in set(shown) - set(keys):
            problems.append(
                f"{page} documents {f'[{section}] ' if section else ''}{key}, which the model does not have"
            )
    for section in set(documented) - set(expected):
        problems.append(f"{page} documents a section [{section}] the model does not have")
    assert not problems, "\n".join(problems)


def _same(shown: Any, default: Any) -> bool:
    if shown is REQUIRED or default is REQUIRED or shown is None or default is None:
        return shown is default
    if isinstance(shown, bool) or isinstance(default, bool):
        return type(shown) is type(default) and shown == default
    return shown == default


def test_the_job_toml_page_names_every_key_of_the_model_with_its_default():
    documented = _tables(DOCS / "job-toml.md")
    expected = _expected(JobSpec)
    assert set(expected) >= {"", "model", "data", "train", "checkpoint"}
    _compare(documented, expected, "docs/job-toml.md")


def test_the_config_toml_page_names_every_key_of_every_section_and_channel():
    from notifiers import CHANNELS
    from notifiers.config import ChannelConfig

    documented = _tables(DOCS / "config-toml.md")
    expected = _expected(Config)
    top = expected.pop("")
    top.pop("notifiers")  # a list of tables, documented per type below
    if top:  # any other top-level key goes under "## Top-level keys"
        expected[""] = top
    expected["hooks"] = {"timeout_seconds": Config.model_fields["hooks"].default.timeout_seconds}
    expected["notifiers"] = {k: _model_default(f) for k, f in ChannelConfig.model_fields.items()}
    for kind, channel in CHANNELS.items():
        own = {k: f for k, f in channel.Config.model_fields.items() if k not in ChannelConfig.model_fields}
        expected[f"notifiers.{kind}"] = {k: _model_default(f) for k, f in own.items()}
    _compare(documented, expected, "docs/config-toml.md")
    from notifiers import EVENT_KINDS

    row = next(ln for ln in (DOCS / "config-toml.md").read_text().splitlines() if ln.startswith("| `events` |"))
    named = set(re.search(r"any of `([^`]+)`", row).group(1).split())
    assert named == set(EVENT_KINDS), (
        f"docs/config-toml.md: the event names differ from the code's: {named ^ set(EVENT_KINDS)}"
    )


def test_the_reference_check_fails_on_a_key_the_page_lacks(tmp_path):
    """The check above can fail: a page without one key, or with a wrong default, is caught."""
    page = (DOCS / "job-toml.md").read_text()
    lacking = tmp_path / "lacking.md"
    lacking.write_text(re.sub(r"^\| `patience` .*\n", "", page, flags=re.M))
    with pytest.raises(AssertionError, match=r"lacks \[early_stopping\] patience"):
        _compare(_tables(lacking), _expected(JobSpec), "lacking.md")
    wrong = tmp_path / "wrong.md"
    wrong.write_text(page.replace("| `keep` | integer ≥ 1 | `3` |", "| `keep` | integer ≥ 1 | `4` |"))
    with pytest.raises(AssertionError, match=r"\[checkpoint\] keep documented with default 4"):
        _compare(_tables(wrong), _expected(JobSpec), "wrong.md")


# --- commands and flags ------------------------------------------------------------------------


@lru_cache(maxsize=None)
def _help(path: tuple[str, ...]) -> tuple[frozenset[str], frozenset[str]]:
    """(subcommands, options) of `orch <path> --help`."""
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *path, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(REPO),
    )
    assert done.returncode == 0, f"orch {' '.join(path)} --help: {done.stderr}"
    text = done.stdout
    commands = set()
    if "Commands:" in text:
        for line in text.split("Commands:", 1)[1].splitlines():
            if m := re.match(r"^  (\w[\w-]*)\s", line):
                commands.add(m.group(1))
    options = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*|-[a-z])\b", text.split("Options:", 1)[-1]))
    return frozenset(commands), frozenset(options)


def _documented_invocations() -> list[tuple[str, str]]:
    """(where, the words after `orch`) for every `orch ...` in inline code, in bash code blocks,
    and after a `$ ` prompt in any code block."""
    found = []
    for page in [README, *sorted(DOCS.glob("*.md"))]:
        spans, lang = [], None
        for line in page.read_text().splitlines():
            if line.lstrip().startswith("```"):
                lang = None if lang is not None else line.strip()[3:].strip()
                continue
            if lang is None:
                spans += re.findall(r"`(orch [^`\n]+)`", line)
            elif re.match(r"^\s*\$ orch ", line) or (lang in ("bash", "sh") and re.match(r"^\s*orch ", line)):
                spans.append(line.strip().lstrip("$ "))
        for span in spans:
            found.append((page.name, span.split("#", 1)[0].split("&&", 1)[0].split("|", 1)[0][len("orch ") :]))
    return found


def test_every_documented_command_and_flag_exists():
    invocations = _documented_invocations()
    assert len(invocations) > 40, invocations  # the docs do show commands
    top_options = _help(())[1]
    problems = []
    for where, words in invocations:
        tokens = [t for t in re.split(r"[\s\[\]]+", words) if t]
        path: list[str] = []
        while tokens and not tokens[0].startswith("-") and tokens[0] in _help(tuple(path))[0]:
            path.append(tokens.pop(0))
        if not path:
            if tokens and not tokens[0].startswith("-"):
                problems.append(f"{where}: `orch {words}`: no command {tokens[0]!r}")
            continue
        options = _help(tuple(path))[1] | top_options
        for token in tokens:
            flag = token.split("=", 1)[0].rstrip(".,;:)")
            if re.fullmatch(r"--[a-z][a-z-]*|-[a-z]", flag) and flag not in options:
                problems.append(f"{where}: `orch {words}`: orch {' '.join(path)} has no option {flag}")
    assert not problems, "\n".join(problems)


# --- the README and the site ---------------------------------------------------------------------

_LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_readme_is_a_landing_page_whose_links_resolve():
    text = README.read_text()
    assert len(text.splitlines()) < 250, "README.md is a landing page; the reference belongs in docs/"
    assert "bash scripts/quickstart.sh" in text and "bash scripts/test.sh" in text
    broken = []
    for target in _LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        if not (REPO / target.split("#", 1)[0]).exists():
            broken.append(target)
    assert not broken, f"README.md links to files that do not exist: {broken}"
    linked = {t.split("#", 1)[0] for t in _LINK.findall(text)}
    assert {"docs/job-toml.md", "docs/config-toml.md", "docs/preemption.md"} <= linked


def test_the_docs_speak_of_the_product_only():
    """No word about how the project is made, no file outside the repository."""
    banned = re.compile(
        r"development box|development machine|DESIGN\.md|SPEC\.md|KINDS\.md|\.\./shared|"
        r"/work/|on the roadmap|the session that|lent to the session",
        re.I,
    )
    hits = []
    for page in [README, REPO / "mkdocs.yml", *sorted(DOCS.glob("*.md"))]:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            if banned.search(line):
                hits.append(f"{page.relative_to(REPO)}:{n}: {line.strip()[:120]}")
    assert not hits, "\n".join(hits)


def test_the_site_builds_strictly(tmp_path):
    try:
        import material  # noqa: F401
        import mkdocs  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"the docs extra is not installed ({exc}); pip install -e '.[docs]'")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    index = (tmp_path / "site" / "index.html").read_text()
    assert "orch" in index and "md-header" in index  # the Material theme rendered it
    for page in ("job-toml", "config-toml", "preemption", "architecture", "benchmarks"):
        assert (tmp_path / "site" / page / "index.html").exists(), page


def test_the_code_cites_no_file_outside_the_repository():
    banned = re.compile(r"DESIGN\.md|SPEC\.md|KINDS\.md|\.\./shared/|development box")
    hits = []
    for folder in ("orchestrator", "training", "notifiers", "tools", "scripts", "examples", "benchmarks", "tests"):
        for path in sorted((REPO / folder).rglob("*")):
            if path.suffix not in (".py", ".sh", ".toml", ".md") or path == Path(__file__).resolve():
                continue
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if banned.search(line):
                    hits.append(f"{path.relative_to(REPO)}:{n}: {line.strip()[:120]}")
    assert not hits, "\n".join(hits)
