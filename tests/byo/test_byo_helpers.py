"""The bring-your-own-trainer helpers in one process, fast: OrchLoop's checkpoint round trip is
exact (model, optimizer, scheduler, RNG, data position), a torn or foreign newest checkpoint is
skipped for an older one, retention keeps the newest; resume_from() for the HF Trainer skips a
broken ORCH_RESUME_FROM and a link the Trainer's rotation left dangling."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import torch

from orchestrator.contract import (
    ENV_CKPT_DIR,
    ENV_RESUME_FROM,
    ENV_RUN_DIR,
    newest_checkpoint,
    notice_name,
    periodic_name,
)
from training.torch_loop import OrchLoop


@pytest.fixture
def contract_env(tmp_path, monkeypatch) -> Path:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    monkeypatch.setenv(ENV_RUN_DIR, str(run))
    monkeypatch.setenv(ENV_CKPT_DIR, str(run / "checkpoints"))
    monkeypatch.delenv(ENV_RESUME_FROM, raising=False)
    return run


def make_parts(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    return model, opt, sched


DATA = (
    torch.randn(40, 6, generator=torch.Generator().manual_seed(1)),
    torch.randn(40, generator=torch.Generator().manual_seed(2)),
)


def train(loop: OrchLoop, model, opt, sched, *, epochs: int = 2, stop_at: int | None = None) -> None:
    pos = loop.resume() or {"epoch": 0, "batch": 0}
    order = torch.Generator()
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(*DATA), batch_size=8, shuffle=True, generator=order
    )
    for epoch in range(pos["epoch"], epochs):
        order.manual_seed(100 + epoch)
        skip = pos["batch"] if epoch == pos["epoch"] else 0
        for i, (x, y) in enumerate(loop.skip(loader, skip), start=skip):
            loss = torch.nn.functional.mse_loss(model(x).squeeze(-1), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            sched.step()
            nxt = {"epoch": epoch, "batch": i + 1} if i + 1 < len(loader) else {"epoch": epoch + 1, "batch": 0}
            if stop_at is not None and loop.step + 1 == stop_at:
                loop.stop.requested = True  # what SIGTERM does
            loop.step_done(data=nxt, epoch=epoch, metrics={"loss": loss.item()}, samples=len(x))
    loop.finish()


@pytest.mark.parametrize("stop_at", [3, 5, 9])  # mid-epoch, the last step of an epoch, mid-epoch 2
def test_orch_loop_stops_with_exit_75_and_resumes_to_identical_weights(contract_env, monkeypatch, stop_at):
    model, opt, sched = make_parts()
    train(OrchLoop(model, opt, sched, total_steps=10), model, opt, sched)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    progress = json.loads((contract_env / "progress.json").read_text())
    assert progress["step"] == progress["total_steps"] == 10
    assert json.loads((contract_env / "result.json").read_text())["steps"] == 10

    for f in (contract_env / "checkpoints").iterdir():
        f.unlink()
    model, opt, sched = make_parts()
    loop = OrchLoop(model, opt, sched, total_steps=10)
    with pytest.raises(SystemExit) as stopped:
        train(loop, model, opt, sched, stop_at=stop_at)
    loop.stop.restore()
    assert stopped.value.code == 75
    path, step = newest_checkpoint(contract_env / "checkpoints")
    assert path.name == notice_name(stop_at) and step == stop_at

    model, opt, sched = make_parts(seed=7)  # other weights and RNG states: all must come from the checkpoint
    random.seed(54321)
    monkeypatch.setenv(ENV_RESUME_FROM, str(path))
    train(OrchLoop(model, opt, sched, total_steps=10), model, opt, sched)
    assert all(torch.equal(expected[k], v) for k, v in model.state_dict().items())


def test_orch_loop_skips_a_torn_newest_checkpoint_and_keeps_the_newest_few(contract_env, monkeypatch, capsys):
    model, opt, sched = make_parts()
    loop = OrchLoop(model, opt, sched, save_every=2, keep=2)
    for _ in range(6):
        loop.step_done(data={"at": loop.step + 1})
    loop.stop.restore()
    ckpts = contract_env / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == [periodic_name(4), periodic_name(6)]
    newest = ckpts / periodic_name(6)
    newest.write_bytes(newest.read_bytes()[:100])  # a kill mid-copy, say
    (ckpts / periodic_name(8)).write_text("not a checkpoint")
    monkeypatch.setenv(ENV_RESUME_FROM, str(ckpts / periodic_name(8)))

    model2, opt2, sched2 = make_parts(seed=3)
    loop2 = OrchLoop(model2, opt2, sched2)
    assert loop2.resume() == {"at": 4}
    loop2.stop.restore()
    assert loop2.step == 4 and loop2.resumed_from == ckpts / periodic_name(4)
    err = capsys.readouterr().err
    assert f"skipping checkpoint {ckpts / periodic_name(8)}" in err and f"skipping checkpoint {newest}" in err


def test_resume_from_skips_a_broken_trainer_checkpoint_and_a_dangling_link(contract_env, monkeypatch, capsys):
    pytest.importorskip("transformers")
    from training.hf_trainer import resume_from

    ckpts = contract_env / "checkpoints"
    trainer = contract_env / "trainer"
    good = trainer / "checkpoint-10"
    good.mkdir(parents=True)
    (good / "trainer_state.json").write_text(json.dumps({"global_step": 10}))
    (good / "model.safetensors").write_bytes(b"x")
    torn = trainer / "checkpoint-20"
    torn.mkdir()
    (torn / "model.safetensors").write_bytes(b"x")  # killed before trainer_state.json
    os.symlink("../trainer/checkpoint-10", ckpts / periodic_name(10))
    os.symlink("../trainer/checkpoint-20", ckpts / notice_name(20))
    os.symlink("../trainer/checkpoint-30", ckpts / periodic_name(30))  # rotated away
    monkeypatch.setenv(ENV_RESUME_FROM, str(ckpts / periodic_name(30)))

    assert resume_from() == str(ckpts / periodic_name(10))
    err = capsys.readouterr().err
    assert "is not a folder" in err and "has no readable trainer_state.json" in err
