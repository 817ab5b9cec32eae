"""The job side of issue 14 over the shared daemon run: TensorBoard files read back equal
metrics.csv, continuous across the resume (and linked under [logging] tensorboard_dir); a job
whose loss goes to NaN stops at that step, fails without a retry and keeps a finite checkpoint
from before it; a flat loss is reported while the job goes on; the end-of-job e-mail carries a
decodable picture of the loss curve."""

from __future__ import annotations

import csv
import struct
import zlib
from pathlib import Path

import pytest

from orchestrator.contract import HEALTH, parse_checkpoint_name, read_json
from orchestrator.model.states import JobState
import tb_reader as tb

pytestmark = pytest.mark.slow


def csv_series(path: Path) -> dict[str, list[tuple[int, float]]]:
    series: dict[str, list[tuple[int, float]]] = {}
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            for key, value in row.items():
                if key not in ("step", "epoch") and value:
                    series.setdefault(key, []).append((int(row["step"]), float(value)))
    return series


def test_tensorboard_holds_the_values_of_metrics_csv_continuous_across_the_resume(scenario):
    h, a = scenario["h"], scenario["a"]
    run_dir = h.run_dir(a)
    files = tb.event_files(run_dir / "tensorboard")
    assert [f.name.rsplit(".", 1)[-1] for f in files] == ["attempt-1", "attempt-2"]
    from_csv, from_tb = csv_series(run_dir / "metrics.csv"), tb.read_scalars(run_dir / "tensorboard")
    assert set(from_csv) == set(from_tb) >= {"train_loss", "val_loss", "val_acc", "lr", "samples_per_s"}
    for metric, rows in from_csv.items():
        got = from_tb[metric]
        assert [s for s, _ in got] == [s for s, _ in rows], metric
        assert all(tb.same_value(x, y) for (_, x), (_, y) in zip(got, rows)), metric
    steps = [s for s, _ in from_csv["train_loss"]]
    resumed_from = h.store.attempts(a)[1].resumed_from_step
    assert steps == sorted(set(steps)), "a step logged twice: the resumed attempt restarted the curve"
    assert min(steps) < resumed_from <= max(steps), (steps, resumed_from)  # rows from both attempts
    assert steps[-1] == 39 and len(steps) == 4  # every 10th of 40 steps, none lost, none twice
    # [logging] tensorboard_dir: <dir>/<name>-<id> is the run's folder
    link = scenario["tf_logs"] / f"sst-tiny-{a}"
    assert link.is_symlink() and link.resolve() == (run_dir / "tensorboard").resolve()


def test_a_diverging_job_stops_at_the_first_nan_and_keeps_the_checkpoint_before_it(scenario):
    import torch

    h, b = scenario["h"], scenario["b"]
    job = h.job(b)
    run_dir = h.run_dir(b)
    health = read_json(run_dir / HEALTH) or {}
    diverged = health.get("diverged")
    assert job.state is JobState.FAILED and job.attempt == 1, (job.state, job.attempt)  # retries = 2: not retried
    assert diverged and ("nan" in diverged["what"].lower() or "inf" in diverged["what"].lower()), health
    step = diverged["step"]
    assert 1 < step < 40, step
    events = {e.kind: e.detail for e in h.store.events(b)}
    assert f"at step {step}" in events["diverged"] and f"at step {step}" in events["failed"]
    # Stopped at once: no step after the NaN one ran.
    assert (read_json(run_dir / "progress.json") or {}).get("step", 0) <= step
    ckpts = sorted(
        (p for p in (run_dir / "checkpoints").iterdir() if parse_checkpoint_name(p.name)),
        key=lambda p: parse_checkpoint_name(p.name).step,
    )
    assert ckpts, "checkpoints every 2 steps: at least one before the divergence"
    assert all(parse_checkpoint_name(p.name).step < step for p in ckpts), [p.name for p in ckpts]
    assert diverged["checkpoint"] == ckpts[-1].name
    state = torch.load(ckpts[-1], map_location="cpu", weights_only=True)["state_dict"]
    assert all(torch.isfinite(t).all() for t in state.values() if t.is_floating_point())
    log = (run_dir / "attempt-1.log").read_text(errors="replace")
    assert f"training diverged: the training loss became nan at step {step}" in log


def test_a_flat_loss_is_reported_once_and_the_job_goes_on(scenario):
    h, d = scenario["h"], scenario["d"]
    assert h.state(d) is JobState.SUCCEEDED
    flats = h.store.events(d, kinds=["loss_flat"])
    assert len(flats) == 1 and "at step 10" in flats[0].detail, flats
    subjects = [m["Subject"] for m in scenario["inbox"].mails]
    assert any(f"job {d} flat has a flat training loss" in s for s in subjects), subjects


def _png_size_and_pixels(data: bytes) -> tuple[int, int, bytes]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, width, height, idat = 8, 0, 0, b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF, kind
        if kind == b"IHDR":
            width, height = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    return width, height, zlib.decompress(idat)


def test_the_end_of_job_email_carries_a_decodable_loss_curve(scenario):
    a = scenario["a"]
    mails = [m for m in scenario["inbox"].mails if m["Subject"] == f"[orch] job {a} sst-tiny succeeded"]
    assert len(mails) == 1, [m["Subject"] for m in scenario["inbox"].mails]
    images = [p for p in mails[0].walk() if p.get_content_type() == "image/png"]
    assert len(images) == 1
    png = images[0].get_content()
    width, height, raw = _png_size_and_pixels(png)
    assert (width, height) == (480, 240) and len(raw) == height * (1 + 3 * width)
    colors = {
        raw[i : i + 3] for y in range(height) for i in range(y * (1 + 3 * width) + 1, (y + 1) * (1 + 3 * width), 3)
    }
    assert bytes((31, 119, 180)) in colors and bytes((255, 127, 14)) in colors  # train_loss and val_loss drawn
    cid = images[0]["Content-ID"].strip("<>")
    html = next(p for p in mails[0].walk() if p.get_content_type() == "text/html").get_content()
    assert f"cid:{cid}" in html
    # The preemption message is not an end-of-job one: text only.
    preempted = [m for m in scenario["inbox"].mails if "was preempted" in m["Subject"]]
    assert preempted and not any(p.get_content_type() == "image/png" for p in preempted[0].walk())
    # The diverged job's failure message has its (short) curve too when it logged rows, and names the step.
    b = scenario["b"]
    failed = [m for m in scenario["inbox"].mails if m["Subject"] == f"[orch] job {b} diverge failed"]
    assert failed and "training diverged" in failed[0].get_body(("plain",)).get_content()
