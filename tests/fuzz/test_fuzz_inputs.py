"""Property-based fuzzing (hypothesis) of what users type: job.toml, config.toml and the CLI's
arguments. Whatever the input: a valid job (or config), or a clear error naming the file and the
field (exit 2) — never a traceback, and the store unchanged when the input is refused.

Documents are built from the real field names (so most examples get past the TOML parser and
exercise the validators) mixed with random keys, random value types and random bytes."""

from __future__ import annotations

import sqlite3
import string
import time
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from orchestrator.jobs.notify import load_config_checked
from orchestrator.spec.config import Config
from orchestrator.model.errors import ConfigError, OrchError, SpecError
from orchestrator.spec.jobspec import JobSpec, load_jobspec
from orchestrator.jobs.lifecycle import submit_job
from orchestrator.home.paths import Home
from orchestrator.store import Store

EXAMPLES = 300
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)

# -- values and documents ------------------------------------------------------------------------

text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
scalars = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    text,
    st.sampled_from(["", "32", "16-mixed", "auto", "val_loss", "max", "file", "aws", "exit"]),
    st.integers(min_value=-3, max_value=100),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(text, inner, max_size=3)),
    max_leaves=8,
)


def fields_of(model: Any) -> dict[str, Any]:
    """Field name -> the nested model's fields (for sections) or None."""
    out: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        nested = None
        for arg in getattr(info.annotation, "__args__", None) or (info.annotation,):
            if isinstance(arg, type) and hasattr(arg, "model_fields"):
                nested = fields_of(arg)
        out[name] = nested
    return out


def documents(tree: dict[str, Any], depth: int = 0) -> st.SearchStrategy[dict[str, Any]]:
    """Dicts whose keys are mostly real field names (sections recurse) with random values, plus
    the odd unknown or misspelt key."""
    key_values = []
    for name, nested in tree.items():
        if nested is not None and depth < 2:
            key_values.append(st.tuples(st.just(name), st.one_of(documents(nested, depth + 1), values)))
        else:
            key_values.append(st.tuples(st.just(name), values))
    junk = st.tuples(st.one_of(text.filter(bool), st.sampled_from([n + "s" for n in tree] or ["x"])), values)
    pairs = st.lists(st.one_of(*key_values, junk), max_size=8)
    return pairs.map(dict)


def to_toml(doc: dict[str, Any]) -> str | None:
    try:
        return tomli_w.dumps(doc)
    except (TypeError, ValueError):  # NaN keys, None... not expressible in TOML
        return None


def raw_bytes() -> st.SearchStrategy[bytes]:
    return st.one_of(st.binary(max_size=80), st.text(alphabet=string.printable, max_size=120).map(str.encode))


def table_counts(db: Path) -> dict[str, int]:
    if not db.exists():
        return {}
    con = sqlite3.connect(db)
    try:
        return {
            t: con.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in ("jobs", "events", "attempts", "outbox")
        }
    finally:
        con.close()


def assert_clear(exc: SpecError, label: str) -> None:
    assert exc.exit_code == 2
    assert exc.problems, "an error with no problem listed"
    for line in exc.problems:
        assert line.startswith(f"{label}: "), f"problem does not name the file: {line!r}"
        assert "Traceback" not in line and len(line) < 2000, line
        assert line[len(label) + 2 :].strip(), f"an empty problem: {line!r}"


# -- job.toml ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fuzz_home(tmp_path_factory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("fuzz")
    home = Home(root / "home").ensure()
    store = Store(home.db)
    store.schema_version()
    yield {"root": root, "home": home, "store": store, "n": [0]}
    store.close()


def _write(env: dict[str, Any], name: str, data: bytes) -> Path:
    env["n"][0] += 1
    path = env["root"] / f"{name}-{env['n'][0]}.toml"
    path.write_bytes(data)
    return path


def mutated_jobs() -> st.SearchStrategy[dict[str, Any]]:
    """A valid command or built-in job with one to three fields set to random values: most of
    these are one problem away from valid, the shape users actually submit."""
    command = {"name": "fuzz", "gpus": 0, "command": ["python", "train.py"]}
    builtin = {
        "name": "fuzz",
        "gpus": 0,
        "model": {"name_or_path": "org/model"},
        "data": {"train": "org/data"},
        "train": {"max_steps": 10},
    }
    tree = fields_of(JobSpec)

    def setter(base: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
        paths = [(k,) for k in tree] + [(k, f) for k, nested in tree.items() if nested for f in nested]
        plausible = st.one_of(
            st.integers(min_value=0, max_value=8), st.booleans(), st.sampled_from(["32", "x"]), values
        )
        return st.lists(st.tuples(st.sampled_from(paths), plausible), min_size=0, max_size=2).map(
            lambda changes: _apply(base, changes)
        )

    return st.one_of(setter(command), setter(builtin))


def _apply(base: dict[str, Any], changes: list[tuple[tuple[str, ...], Any]]) -> dict[str, Any]:
    import copy

    doc = copy.deepcopy(base)
    for path, value in changes:
        target = doc
        for part in path[:-1]:
            if not isinstance(target.get(part), dict):
                target[part] = {}
            target = target[part]
        target[path[-1]] = value
    return doc


@FUZZ
@given(doc=st.one_of(documents(fields_of(JobSpec)), mutated_jobs()))
def test_job_toml_is_a_valid_job_or_a_clear_error_and_a_refusal_leaves_the_store_alone(fuzz_home, doc):
    data = to_toml(doc)
    assume(data is not None)  # not expressible in TOML: not an example
    path = _write(fuzz_home, "job", data.encode())
    before = table_counts(fuzz_home["home"].db)
    try:
        job = submit_job(fuzz_home["store"], Config(), fuzz_home["home"], path, now=time.time(), machine_gpus=64)
    except SpecError as exc:
        assert_clear(exc, str(path))
        assert table_counts(fuzz_home["home"].db) == before
        event("refused")
        return
    except OrchError as exc:  # refused for another reason (e.g. a dependency): still no change
        assert exc.exit_code in (1, 2) and str(exc)
        assert table_counts(fuzz_home["home"].db) == before
        return
    event("valid")
    assert job.id and job.state.value == "queued"
    assert table_counts(fuzz_home["home"].db)["jobs"] == before.get("jobs", 0) + 1


@FUZZ
@given(data=raw_bytes())
def test_job_toml_random_bytes_never_traceback(fuzz_home, data):
    path = _write(fuzz_home, "raw", data)
    try:
        spec = load_jobspec(path, check_paths=False)
    except SpecError as exc:
        assert_clear(exc, str(path))
    else:
        assert isinstance(spec, JobSpec)


# -- config.toml ---------------------------------------------------------------------------------------


@FUZZ
@given(doc=documents(fields_of(Config)))
def test_config_toml_is_valid_or_a_clear_error(fuzz_home, doc):
    doc.pop("path", None)
    data = to_toml(doc)
    assume(data is not None)  # not expressible in TOML: not an example
    path = _write(fuzz_home, "config", data.encode())
    try:
        config = load_config_checked(path, required=True, env={})
    except ConfigError as exc:
        assert_clear(exc, str(path))
    else:
        assert isinstance(config, Config)


@FUZZ
@given(data=raw_bytes())
def test_config_toml_random_bytes_never_traceback(fuzz_home, data):
    path = _write(fuzz_home, "rawconfig", data)
    try:
        load_config_checked(path, required=True, env={})
    except ConfigError as exc:
        assert_clear(exc, str(path))


# -- the CLI's arguments -----------------------------------------------------------------------------

words = st.one_of(
    st.sampled_from(
        [
            "submit",
            "run",
            "status",
            "show",
            "logs",
            "cancel",
            "retry",
            "cost",
            "daemon",
            "notify",
            "config",
            "check",
            "test",
            "stop",
            "drain",
            "doctor",
            "--json",
            "--all",
            "--priority",
            "--after",
            "--at",
            "--resume",
            "--budget",
            "--hours",
            "-n",
            "--channel",
            "--timeout",
            "--help",
            "-1",
            "0",
            "1",
            "99999999999999999999",
            "+30m",
            "+2h",
            "2026-12-01T02:00",
            "tomorrow",
            "nan",
            "inf",
            "-",
            "--",
            "",
        ]
    ),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=10),
)
# Never `daemon run`/`daemon start` (they would start a daemon) nor `run` with a file (it trains).
FORBIDDEN = ({"daemon", "run"}, {"daemon", "start"})


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(args=st.lists(words, min_size=1, max_size=5))
def test_cli_arguments_exit_0_1_or_2_never_a_traceback_and_refusals_change_nothing(fuzz_home, args):
    from typer.testing import CliRunner

    from orchestrator.cli.app import app

    assume(
        not (
            args[0] == "run"
            or any(pair <= set(args) for pair in FORBIDDEN)
            or ("daemon" in args and "drain" in args)
            or {"-f", "--follow"} & set(args)
        )
    )  # `logs -f` of a queued job follows until it ends
    home = fuzz_home["home"]
    before = table_counts(home.db)
    result = CliRunner().invoke(app, ["--home", str(home.root), *args], env={"NO_COLOR": "1"})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(
            f"orch {args!r} raised {type(result.exception).__name__}: {result.exception}"
        ) from result.exception
    assert result.exit_code in (0, 1, 2), (args, result.exit_code, result.output)
    assert "Traceback" not in result.output
    if result.exit_code != 0:
        assert table_counts(home.db) == before, f"orch {args!r} failed ({result.exit_code}) but changed the store"
