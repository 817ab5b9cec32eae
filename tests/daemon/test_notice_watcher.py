"""The daemon's notice watcher over its preemption sources (a notice reported once, dispatch held
until it clears, a rebalance that does not hold it, a source gone silent or broken), the sentinel
file source, and the sources built from config.toml's names. The providers' own formats, against
loopback servers, are in test_preemption_sources.py."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from orchestrator.model.errors import ConfigError
from orchestrator.daemon.notice_watch import NoticeWatcher
from orchestrator.daemon.preemption import PREEMPT, REBALANCE, AwsSource, FileSource, GcpSource, build_sources

NOW = 1_790_000_000.0
TIMEOUT_S = 0.25

from metadata_fakes import FakeAws, FakeGcp, closed_port_url, serve  # noqa: E402,F401  (fixtures)


# --- file and signal sources -------------------------------------------------------------


@pytest.mark.parametrize("content, deadline", [(None, None), ("", None), ("90", NOW + 90), ("soon", None)])
def test_file_source_existence_is_a_notice(tmp_path: Path, content, deadline):
    path = tmp_path / "preempt-notice"
    source = FileSource(path)
    assert source.poll(NOW) is None
    path.write_text(content or "")
    notice = source.poll(NOW)
    assert (notice.source, notice.kind, notice.deadline) == ("file", PREEMPT, deadline)
    path.unlink()
    assert source.poll(NOW) is None


# --- the watcher -------------------------------------------------------------------------


def test_watcher_reports_a_notice_once_and_holds_dispatch_until_it_clears(tmp_path: Path):
    path = tmp_path / "notice"
    watcher = NoticeWatcher([FileSource(path)])
    assert watcher.poll_all(NOW) == [] and not watcher.notice_active
    path.write_text("")
    [notice] = watcher.poll_all(NOW)
    assert notice.kind == PREEMPT and watcher.notice_active
    assert watcher.poll_all(NOW + 5) == [] and watcher.notice_active
    path.unlink()
    assert watcher.poll_all(NOW + 10) == [] and not watcher.notice_active


def test_watcher_rebalance_is_reported_but_does_not_hold_dispatch(serve):
    fake = FakeAws()
    fake.rebalance = (200, json.dumps({"noticeTime": "2026-09-18T08:17:00Z"}))
    watcher = NoticeWatcher([AwsSource(serve(fake), timeout_s=TIMEOUT_S)])
    [notice] = watcher.poll_all(NOW)
    assert notice.kind == REBALANCE and not watcher.notice_active


def test_watcher_keeps_a_notice_while_its_source_goes_silent(serve):
    """Right after a preemption notice the metadata server may vanish; that is not an all-clear."""
    fake = FakeGcp()
    fake.preempted = "TRUE"
    watcher = NoticeWatcher([GcpSource(serve(fake), timeout_s=TIMEOUT_S)])
    assert len(watcher.poll_all(NOW)) == 1
    fake.preempted = "garbage"
    assert watcher.poll_all(NOW + 5) == [] and watcher.notice_active


def test_watcher_logs_one_warning_per_error_streak(closed_port_url, tmp_path, caplog):
    watcher = NoticeWatcher([AwsSource(closed_port_url, timeout_s=TIMEOUT_S), FileSource(tmp_path / "n")])
    with caplog.at_level(logging.DEBUG, logger="orch.preemption"):
        for i in range(4):
            watcher.poll_all(NOW + i)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "aws" in warnings[0].getMessage()


def test_watcher_survives_a_source_that_raises_anything():
    class Broken:
        name = "broken"

        def poll(self, now):
            raise RuntimeError("bug")

    assert NoticeWatcher([Broken()]).poll_all(NOW) == []


# --- building from config ----------------------------------------------------------------


def test_build_sources_from_config_names(tmp_path: Path):
    sources = build_sources(["aws", "gcp", "azure", "file"], file_path=tmp_path / "n", timeout_s=0.3)
    assert [s.name for s in sources] == ["aws", "gcp", "azure", "file"]
    assert sources[0].endpoint == "http://169.254.169.254"
    assert sources[1].endpoint == "http://metadata.google.internal"
    NoticeWatcher(sources).close()


@pytest.mark.parametrize("names, file_path", [(["ec2"], None), (["file"], None)])
def test_build_sources_rejects_bad_config(names, file_path):
    with pytest.raises(ConfigError):
        build_sources(names, file_path=file_path)


def test_daemon_side_modules_stay_light():
    """preemption, cost and hooks run inside the daemon: no ML stack may come in with them."""
    import subprocess
    import sys

    heavy = ("torch", "lightning", "pytorch_lightning", "transformers", "datasets")
    code = (
        "import sys, orchestrator.daemon.preemption, orchestrator.cost.money, orchestrator.daemon.hooks; "
        f"print(','.join(m for m in {heavy!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == ""
