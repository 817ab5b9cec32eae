"""(e) the notice checkpoint of BERT-large + AdamW held on the GPU: end of step -> durable file
through the runner, against a bare torch.save of the same state in the same process (jobwrap's
--notice-times), twice, order alternated; steps lost and start-up of the resumed attempt."""

from __future__ import annotations

import json
import math
import signal
import statistics
import time
from typing import Any, Optional

from .assets import write_rows
from .common import on_device, rows
from .frame import Ctx, Section, free_run, read_json, wait_for
from orchestrator.contract import EX_CHECKPOINTED, notice_name


def notice(ctx: Ctx, sec: Section) -> None:
    s = ctx.sizes
    model = ctx.model(s.large)
    run = ctx.work / "e-notice"
    data = write_rows(ctx.work / "data" / "notice.jsonl", rows(ctx, 400, seed=9))
    ctx.write_job(
        run,
        model=model,
        train=data,
        seq=s.notice_seq,
        batch=s.notice_batch,
        precision=s.notice_precision,
        lr=2e-5,
        steps=100_000,
        epochs=1000,
        keep=1,
    )
    times = run / "notice-times.jsonl"
    wrap = ["--notice-times", str(times)]
    env = {"ORCH_PROGRESS_EVERY_S": "0.000001"}
    attempts: list[dict[str, Any]] = []
    resume_from = 0
    for attempt, order in ((1, "orch-first"), (2, "bare-first")):
        proc = ctx.start_job(run, attempt=attempt, wrap=wrap, GPUCHECK_NOTICE_ORDER=order, **env)
        at = resume_from + 3

        def reached() -> Optional[dict]:
            p = read_json(run / "progress.json") or {}
            fresh = (p.get("updated_at") or 0) >= proc.launched
            return p if (fresh and (p.get("step") or 0) >= at) or not proc.alive() else None

        first = wait_for(
            lambda: (lambda p: p if (p.get("first_step_at") or 0) >= proc.launched or not proc.alive() else None)(
                read_json(run / "progress.json") or {}
            ),
            ctx.timeout(300),
        )
        progress = wait_for(reached, ctx.timeout(300))
        sent = time.time()
        proc.signal(signal.SIGTERM)
        code = proc.wait(ctx.timeout(300))
        exited = time.time()
        sec.require(f"attempt {attempt}: SIGTERM -> exit 75", code == EX_CHECKPOINTED, f"exit {code}: {proc.tail()}")
        if attempt == 2:
            sec.check(
                "attempt 2 resumed from the notice checkpoint",
                f"resuming from {notice_name(resume_from)}" in proc.output(),
            )
        on_device(ctx, sec, f"attempt {attempt}", proc)
        lines = [json.loads(x) for x in times.read_text().splitlines()] if times.exists() else []
        sec.require(f"attempt {attempt}: the notice save was timed", len(lines) == attempt, f"{len(lines)} lines")
        line = lines[-1]
        last = read_json(run / "progress.json") or {}
        attempts.append(
            {
                "order": order,
                "notice_step": line["step"],
                "orch_s": line["orch_s"],
                "bare_s": line["bare"]["s"],
                "orch_bytes": line["orch_bytes"],
                "bare_bytes": line["bare"]["bytes"],
                "steps_lost": int(last.get("step") or 0) - line["step"],
                "sigterm_to_exit_s": exited - sent,
                "launch_to_first_step_s": (first.get("first_step_at") or math.nan) - proc.launched if first else None,
            }
        )
        sec.check(
            f"attempt {attempt}: no step lost (notice at the last finished step)",
            attempts[-1]["steps_lost"] == 0,
            f"progress at {last.get('step')}, notice at {line['step']}",
        )
        resume_from = line["step"]
        del progress
    orch = [a["orch_s"] for a in attempts]
    bare = [a["bare_s"] for a in attempts]
    ratio = statistics.median(orch) / statistics.median(bare)
    sec.figures.update(
        {
            "model": f"BERT {s.large} + AdamW ({s.notice_precision})",
            "attempts": attempts,
            "orch_s": orch,
            "bare_s": bare,
            "ratio_orch_over_bare": ratio,
            "goal": s.goal_notice_ratio,
            "checkpoint_mb": attempts[0]["orch_bytes"] / 1e6,
            "bare_mb": attempts[0]["bare_bytes"] / 1e6,
        }
    )
    sec.headline = (
        f"end of step -> durable: orch {statistics.median(orch):.2f} s vs bare torch.save "
        f"{statistics.median(bare):.2f} s = {ratio:.2f}x (goal <= {s.goal_notice_ratio}); "
        f"{attempts[0]['orch_bytes'] / 1e6:.0f} MB"
    )
    if ctx.gpu:
        sec.check(
            f"notice save within {s.goal_notice_ratio}x a bare torch.save", ratio <= s.goal_notice_ratio, f"{ratio:.2f}"
        )
    else:
        sec.notes.append("CPU rehearsal: a tiny model stands in for BERT-large; the ratio is reported, not judged.")
    free_run(run)
