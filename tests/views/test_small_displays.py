"""Small things a user reads: durations not truncated by a minute, moments with their year and
zone, deadline advice that never proposes an impossible cut, advice that never saves 0.00, and the
sweeps guide's `orch status` example as plain `orch status` prints it. Pure, no processes."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from orchestrator.cost.advice import checkpoint_advice, idle_advice, startup_advice
from orchestrator.views.deadlines import deadline_line
from orchestrator.cost.money import format_duration
from orchestrator.model.clock import format_clock
from orchestrator.daemon.deadlines import at_risk_text
from orchestrator.planning.forecast import Forecast
from orchestrator.cost.ledger import PARTS, Ledger
from orchestrator.model.states import JobState
from tests.cost.test_cost_planning import make_job

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.mark.parametrize("seconds, text", [(114.5, "1m 54s"), (119.6, "2m"), (61, "1m 01s"), (720, "12m")])
def test_durations_under_an_hour_keep_their_seconds(seconds, text):
    assert format_duration(seconds) == text


def test_a_moment_is_shown_with_its_year_and_zone():
    ts = time.mktime((2026, 12, 5, 18, 0, 0, 0, 0, -1))
    shown = format_clock(ts)
    assert shown.startswith("2026-12-05 18:00 ") and shown.split()[-1] == time.strftime("%Z", time.localtime(ts))
    assert format_clock(float("inf")) == "never" and format_clock(None) == "unknown"
    line = deadline_line({"deadline": "2026-12-05T18:00:00+00:00", "projected_finish": ts})
    assert line is not None and line.count("2026-") == 2, line


def _risk(state: str, start: float, finish: float, deadline: float, now: float = 1000.0) -> str:
    job = make_job(state=JobState(state), priority=0)
    return at_risk_text(job, deadline, Forecast(start, finish, False), now)


def test_deadline_advice_never_cuts_what_the_queue_ahead_already_makes_late():
    # queued behind 2 h of others, the deadline 1 h from now, its own run 30 min: no cut helps
    text = _risk("queued", 1000.0 + 7200, 1000.0 + 9000, 1000.0 + 3600)
    assert "cut by" not in text and "no cut of its own run can meet it" in text and "queue ahead" in text
    # 10 min late on a 40-min run: a 25 % cut (rounded up) meets it
    text = _risk("queued", 1000.0 + 600, 1000.0 + 3000, 1000.0 + 2400)
    assert "max_steps cut by 25%" in text
    # running for an hour, 10 min left, 20 min late: the remaining steps cannot absorb it
    text = _risk("running", 1000.0 - 3600, 1000.0 + 600, 1000.0 - 600)
    assert "cut by" not in text and "left to run" in text
    assert "100%" not in _risk("queued", 1000.0, 1000.0 + 1000, 1000.0 + 5)


def _ledger(part: str, money: float, billed: float, attempts: int = 1) -> Ledger:
    seconds = {p: 0.0 for p in PARTS}
    spent = {p: 0.0 for p in PARTS}
    seconds[part], spent[part] = 10.0, money
    spent["useful"] = billed - money
    return Ledger(seconds, spent, 100.0, billed, True, attempts=attempts)


def test_advice_never_saves_up_to_nothing():
    tiny = _ledger("checkpoint", 0.004, 0.01)  # 40 % of a bill of one cent
    assert checkpoint_advice(tiny, {"checkpoint": {"background": False}}, "CNY") is None
    assert checkpoint_advice(tiny, {"checkpoint": {"every_n_steps": 10}}, "CNY") is None
    assert startup_advice(_ledger("startup", 0.008, 0.02, attempts=2), {}, "CNY") is None
    assert idle_advice(0.004, 0.01, None, 0.001, 1, "CNY") is None
    line = checkpoint_advice(_ledger("checkpoint", 0.04, 0.1), {"checkpoint": {"background": False}}, "CNY")
    assert line is not None and "0.00 CNY" not in line


def test_the_sweeps_guide_shows_plain_status_without_finished_trials():
    text = (DOCS / "sweeps.md").read_text()
    block = re.search(r"^\$ orch status(?! --all).*?\n(.*?)^\$", text, re.S | re.M)
    assert block, "the guide has a plain `orch status` example"
    assert not re.search(r"\b(succeeded|pruned|failed|cancelled)\b", block.group(1)), block.group(1)
