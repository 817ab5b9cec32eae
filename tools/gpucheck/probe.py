"""`python -m tools.gpucheck.probe MODEL SEQ OUT.json`: how much GPU memory one more sample of
SEQ tokens takes in a bf16-mixed training step of MODEL with AdamW (two batch sizes, the peak of
each), and how much the card has; the OOM section picks its overflowing batch from that."""

from __future__ import annotations

import json
import sys


def peak_for(model, opt, batch: int, seq: int) -> int:
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    ids = torch.randint(5, 400, (batch, seq), device="cuda")
    labels = torch.zeros(batch, dtype=torch.long, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del ids, labels, loss
    return int(peak)


def main(model_dir: str, seq: int, out: str) -> int:
    import torch
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=2).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    small, big = 8, 24
    peak_for(model, opt, small, seq)  # warm-up: AdamW state, cuBLAS workspaces
    p_small = peak_for(model, opt, small, seq)
    p_big = peak_for(model, opt, big, seq)
    per_sample = (p_big - p_small) / (big - small)
    free, total = torch.cuda.mem_get_info()
    result = {
        "per_sample_bytes": per_sample,
        "base_bytes": p_small - small * per_sample,
        "total_bytes": total,
        "free_bytes_with_probe": free,
        "reserved_by_probe": torch.cuda.memory_reserved(),
        "device": torch.cuda.get_device_name(0),
        "seq": seq,
    }
    with open(out, "w") as fh:
        json.dump(result, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
