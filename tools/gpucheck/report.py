"""The report of the GPU check: the environment it ran in, report.json (every check and figure),
summary.md (readable) and logs.tar.gz (each process's log and the run folders' small files)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import tarfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .frame import REPO, Sizes, read_json

SCHEMA = 1


def environment(sizes: Sizes) -> dict[str, Any]:
    import importlib.metadata as md

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "mode": sizes.mode,
    }
    for dist in (
        "torch",
        "pytorch-lightning",
        "transformers",
        "datasets",
        "pydantic",
        "apscheduler",
        "torchdata",
        "typer",
        "tokenizers",
        "huggingface-hub",
        "pyarrow",
    ):
        try:
            env[dist] = md.version(dist)
        except md.PackageNotFoundError:
            env[dist] = None
    try:
        import torch

        env["torch_cuda"] = torch.version.cuda
        env["cuda_available"] = torch.cuda.is_available()
    except Exception as exc:  # pragma: no cover - torch is required
        env["torch_error"] = str(exc)
    from orchestrator.host.gpus import discover

    env["gpus"] = [asdict(g) for g in discover()]
    plan = os.environ.get("GPUCHECK_WHEELS_PLAN")
    if plan and Path(plan).exists():
        env["wheels"] = read_json(Path(plan))
    try:
        env["commit"] = (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], cwd=str(REPO), capture_output=True, text=True, timeout=5
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        env["commit"] = None
    return env


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)) and len(value) > 8:
        return f"[{len(value)} values]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_fmt(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    return str(value)


def summary_md(report: dict[str, Any]) -> str:
    env = report["environment"]
    mark = {"pass": "PASS", "fail": "**FAIL**", "skipped": "skipped"}
    gpus = ", ".join(f"{g['name']} ({g['memory_mib'] / 1024:.0f} GiB)" for g in env.get("gpus") or []) or "none"
    lines = [
        f"# orch GPU check ({report['mode']} mode): {'all passed' if report['ok'] else 'FAILED'}",
        "",
        f"- when: {report['started']} UTC, {report['wall_s']:.0f} s of a {report['budget_s']:.0f} s budget",
        f"- GPU: {gpus}; CPUs: {env.get('cpus')}",
        f"- Python {env.get('python')}, torch {env.get('torch')} (CUDA {env.get('torch_cuda')}), "
        f"Lightning {env.get('pytorch-lightning')}, transformers {env.get('transformers')}, "
        f"datasets {env.get('datasets')}, commit {env.get('commit')}",
    ]
    wheels = env.get("wheels")
    if wheels:
        lines.append(
            f"- wheels installed into the private folder: {len(wheels.get('install') or {})} "
            f"of {wheels.get('wheels_available')}; unmet: {'; '.join(wheels.get('unmet') or []) or 'none'}"
        )
    if report["mode"] == "cpu":
        lines.append(
            "- CPU rehearsal: tiny models; 16-mixed runs as 32 on the CPU; the out-of-memory is SIMULATED "
            "(ORCH_FAULT_OOM_ABOVE_BATCH); the GPU goals (throughput >= 0.98, notice <= 1.5x) are reported, "
            "not judged."
        )
    lines += ["", "| | section | status | figures |", "| --- | --- | --- | --- |"]
    for s in report["sections"]:
        figure = s["headline"] or s["reason"]
        lines.append(f"| {s['letter']} | {s['title']} | {mark[s['status']]} | {figure.replace('|', '/')} |")
    for s in report["sections"]:
        lines += ["", f"## ({s['letter']}) {s['title']}: {mark[s['status']]}", ""]
        if s["reason"]:
            lines.append(f"{s['reason']}  ")
        lines.append(f"wall time {s['wall_s']:.1f} s")
        if s["checks"]:
            lines.append("")
            for c in s["checks"]:
                detail = f" ({c['detail']})" if c["detail"] and (not c["ok"] or len(c["detail"]) < 160) else ""
                lines.append(f"- [{'x' if c['ok'] else ' '}] {c['name']}{detail.replace(chr(10), ' / ')}")
        if s["figures"]:
            lines.append("")
            for key, value in s["figures"].items():
                lines.append(f"- {key}: {_fmt(value)}")
        for note in s["notes"]:
            lines += ["", f"> {note}"]
    return "\n".join(lines) + "\n"


def pack_logs(work: Path, dest: Path) -> None:
    with tarfile.open(dest, "w:gz") as tar:
        for path in sorted(work.rglob("*")):
            if path.is_file() and (
                path.suffix in (".log", ".out", ".exit")
                or path.name
                in (
                    "job.toml",
                    "batch.json",
                    "result.json",
                    "progress.json",
                    "metrics.csv",
                    "clock.json",
                    "notice-times.jsonl",
                    "config.toml",
                    "daemon.log",
                )
            ):
                if path.stat().st_size < 2_000_000:
                    tar.add(str(path), arcname=str(path.relative_to(work)))


def write_report(report: dict[str, Any], out: Path, started: float) -> None:
    report["wall_s"] = time.monotonic() - started
    tmp = out / ".report.json.tmp"
    tmp.write_text(json.dumps(report, indent=1, default=str))
    os.replace(tmp, out / "report.json")
    (out / "summary.md").write_text(summary_md(report))
