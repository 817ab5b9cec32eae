"""`python -m tools.gpucheck [--cpu] OUT` (what scripts/gpu-check.sh runs): the sections in
order under a time budget, each one's failure contained, the report rewritten after each."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

from .frame import CPU, GPU, Ctx, Section, Sizes, Skip, StopSection
from .report import SCHEMA, environment, pack_logs, summary_md, write_report


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/gpu-check.sh", description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder for report.json, summary.md and logs.tar.gz")
    parser.add_argument("--cpu", action="store_true", help="rehearse on the CPU at tiny sizes")
    parser.add_argument("--only", default="", help="comma-separated section letters or keys (default: all)")
    parser.add_argument("--budget-s", type=float, default=None, help="stop starting sections after this many seconds")
    parser.add_argument("--work", type=Path, default=None, help="work folder (default: a new temp folder)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    return parser.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    from .sections import SECTIONS

    sizes = CPU if args.cpu else GPU
    if args.budget_s:
        sizes = Sizes(**{**asdict(sizes), "budget_s": args.budget_s})
    if not args.cpu:
        import torch

        if not torch.cuda.is_available():
            print("gpu-check: no CUDA GPU is visible to torch; run with --cpu for the CPU rehearsal", file=sys.stderr)
            return 2
    wanted = {w.strip() for w in args.only.split(",") if w.strip()}
    unknown = wanted - {k for k, *_ in SECTIONS} - {letter for _, letter, *_ in SECTIONS}
    if unknown:
        print(f"gpu-check: --only: unknown section(s) {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="orch-gpucheck-"))
    work.mkdir(parents=True, exist_ok=True)
    started_wall, started = time.time(), time.monotonic()
    ctx = Ctx(sizes, args.out, work, deadline=started + sizes.budget_s)
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "mode": sizes.mode,
        "ok": False,
        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started_wall)),
        "budget_s": sizes.budget_s,
        "sizes": asdict(sizes),
        "environment": environment(sizes),
        "sections": [],
    }
    try:
        for key, letter, title, func, min_s in SECTIONS:
            sec = Section(key, letter, title)
            t0 = time.monotonic()
            if wanted and key not in wanted and letter not in wanted:
                sec.status, sec.reason = "skipped", "not selected (--only)"
            elif ctx.left() < min_s:
                sec.status, sec.reason = (
                    "skipped",
                    (
                        f"time budget: {max(0, ctx.left()):.0f} s left of "
                        f"{sizes.budget_s:.0f}, the section needs about {min_s} s"
                    ),
                )
            else:
                print(f"[gpu-check] ({letter}) {title} ...", file=sys.stderr, flush=True)
                try:
                    func(ctx, sec)
                except Skip as exc:
                    sec.status, sec.reason = "skipped", str(exc)
                except StopSection:
                    pass
                except Exception as exc:
                    sec.check(
                        "ran without an error in the check itself",
                        False,
                        f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}",
                    )
                finally:
                    ctx.cleanup()
            sec.wall_s = time.monotonic() - t0
            sec.settle()
            print(
                f"[gpu-check] ({letter}) {sec.status}: {sec.headline or sec.reason} [{sec.wall_s:.0f} s]",
                file=sys.stderr,
                flush=True,
            )
            report["sections"].append(asdict(sec))
            write_report(report, args.out, started)
    finally:
        ctx.cleanup()
        complete = len(report["sections"]) == len(SECTIONS)
        report["ok"] = complete and all(s["status"] != "fail" for s in report["sections"])
        write_report(report, args.out, started)
        try:
            pack_logs(work, args.out / "logs.tar.gz")
        except OSError as exc:
            print(f"[gpu-check] could not pack the logs: {exc}", file=sys.stderr)
        if args.keep:
            print(f"[gpu-check] kept the work folder {work}", file=sys.stderr)
        elif args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(summary_md(report).split("\n## ")[0], flush=True)
    print(f"[gpu-check] report: {args.out / 'report.json'}, {args.out / 'summary.md'}", file=sys.stderr)
    return 0 if report["ok"] else 1
