"""Rules of the code base that a reader cannot see broken from one file: SQL only in the store,
the job-process contract's names spelled only in orchestrator/contract.py, and fuzz tests that
skip an example with `assume()`. (Citations of files outside the repository: test_docs.py.)"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PRODUCT = ("orchestrator", "notifiers", "training")


def sources(*packages: str) -> list[Path]:
    return sorted(p for pkg in packages for p in (REPO / pkg).rglob("*.py"))


def rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def string_constants(path: Path) -> list[tuple[int, str]]:
    """Every string literal in a module (f-string parts included), with its line, docstrings
    left out: they may name a file for a reader."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return [
        (n.lineno, n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
    ]


# -- SQL lives in orchestrator/store/ ------------------------------------------------------------------

SQL = re.compile(
    r"\b(SELECT\s+[\w*(]|INSERT\s+INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM|CREATE\s+(TABLE|INDEX)|"
    r"ALTER\s+TABLE|PRAGMA\s+\w+|BEGIN\s+IMMEDIATE)"
)
SQL_CALLS = re.compile(r"sqlite3\.connect\(|\.execute(many|script)?\(")


def sql_outside_the_store() -> list[str]:
    found = []
    for path in sources(*PRODUCT):
        if rel(path).startswith("orchestrator/store/"):
            continue
        for line, text in string_constants(path):
            if SQL.search(text):
                found.append(f"{rel(path)}:{line}: SQL text {text[:60]!r}")
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if SQL_CALLS.search(line) and not line.lstrip().startswith("#"):
                found.append(f"{rel(path)}:{n}: {line.strip()[:80]}")
    return found


def test_sql_is_written_only_in_the_store():
    assert sql_outside_the_store() == []


# -- fuzz tests skip with assume() ------------------------------------------------------------------------


def early_returns_in_property_tests(path: Path) -> list[str]:
    """`if ...: return` at the top of a @given test: hypothesis counts that example as passed,
    so a filter that rejects everything would still be green. assume() makes it an invalid example."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef):
            continue
        decorators = [ast.unparse(d) for d in fn.decorator_list]
        if not any(d.startswith("given(") for d in decorators):
            continue
        for stmt in fn.body:
            if isinstance(stmt, ast.If) and any(isinstance(s, ast.Return) for s in stmt.body):
                found.append(f"{rel(path)}:{stmt.lineno}: {fn.name} returns early; use assume()")
    return found


@pytest.mark.parametrize("path", sorted((REPO / "tests").rglob("test_fuzz*.py")), ids=lambda p: p.name)
def test_property_tests_skip_examples_with_assume_not_return(path):
    assert early_returns_in_property_tests(path) == []


# -- the job-process contract is spelled only in orchestrator/contract.py -------------------------------


def contract_names() -> tuple[set[str], set[str]]:
    """(file names in the run folder, folder names in it), read from the contract itself."""
    from orchestrator import contract

    files = {
        contract.JOB_TOML,
        contract.PROGRESS,
        contract.RESULT,
        contract.BATCH,
        contract.METRICS_CSV,
        contract.HEALTH,
        contract.CHECKPOINT_INTERVAL,
        contract.DISK_FULL,
        contract.BEST_NAME,
    }
    folders = {contract.CHECKPOINTS, contract.MODEL, contract.TENSORBOARD}
    return files, folders


def contract_literals(path: Path, label: str = "") -> list[str]:
    """What spells a contract name by hand: a run-folder file name, an ORCH_* name, an exit code
    75/76, a run-folder folder joined onto a path, an attempt-<n>.<kind> or checkpoint name built
    with an f-string."""
    files, folders = contract_names()
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    found = []

    def where(node: ast.AST) -> str:
        return f"{label or rel(path)}:{getattr(node, 'lineno', '?')}"

    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and id(node) not in docstrings:
            value = node.value.decode(errors="replace") if isinstance(node.value, bytes) else node.value
            if isinstance(value, str) and (value in files or re.fullmatch(r"ORCH_[A-Z0-9_]+", value)):
                found.append(f"{where(node)}: {value!r}")
            if type(value) is int and value in (75, 76):
                found.append(f"{where(node)}: exit code {value}")
        if (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.Div)
            and isinstance(node.right, ast.Constant)
            and node.right.value in folders
        ):
            found.append(f"{where(node)}: / {node.right.value!r}")
        if (
            isinstance(node, ast.Call)
            and ast.unparse(node.func) in ("Path", "os.path.join")
            and any(isinstance(a, ast.Constant) and a.value in folders for a in node.args)
        ):
            found.append(f"{where(node)}: {ast.unparse(node)[:60]}")
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
            if re.match(r"attempt-\{\}\.", text) or re.search(r"step-\{\}\.ckpt", text):
                found.append(f"{where(node)}: f-string {text!r}")
    return found


def test_contract_names_are_spelled_only_in_the_contract_module():
    offenders = [
        hit for path in sources(*PRODUCT) if rel(path) != "orchestrator/contract.py" for hit in contract_literals(path)
    ]
    assert offenders == [], "use the names from orchestrator/contract.py:\n" + "\n".join(offenders)


def test_the_contract_rule_catches_each_kind_of_hand_spelled_name(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text(
        'import os\nfrom pathlib import Path\nrun = Path(".")\nn = 1\n'
        'a = run / "result.json"\nb = os.environ["ORCH_RUN_DIR"]\nc = run / "checkpoints"\n'
        'd = run / f"attempt-{n}.exit"\ne = 75\n'
    )
    hits = contract_literals(planted, label="planted.py")
    assert len(hits) == 5, hits
