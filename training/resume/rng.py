"""Global RNG states (python, numpy when installed, torch, cuda) as checkpoint-safe data: only
tensors, ints, floats, tuples and None, so `torch.load(weights_only=True)` (Lightning's default)
reads them. Used by OrchCallback (Lightning) and OrchLoop (plain PyTorch) alike."""

from __future__ import annotations

import random
from typing import Any, Mapping

import torch


def _numpy() -> Any:
    try:
        import numpy as np  # torch imports it when installed; without it there is no state to keep
    except ImportError:
        return None
    return np


def capture() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    np = _numpy()
    if np is not None:
        kind, keys, pos, has_gauss, gauss = np.random.get_state()
        state["numpy"] = {
            "kind": str(kind),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore(state: Mapping[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    np = _numpy() if "numpy" in state else None
    if np is not None:
        s = state["numpy"]
        np.random.set_state((s["kind"], s["keys"].numpy().astype(np.uint32), s["pos"], s["has_gauss"], s["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        saved = state["cuda"]
        if len(saved) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(saved)
        else:  # a different GPU count: each device gets the first saved state
            for i in range(torch.cuda.device_count()):
                torch.cuda.set_rng_state(saved[0], i)
