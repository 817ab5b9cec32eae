"""A sweep and its trials as plain rows (the store writes them; the controller, CLI and dashboard read them)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

from .states import Word


class SweepState(Word):
    RUNNING = "running"  # trials are being proposed, run or awaited
    SUCCEEDED = "succeeded"  # every trial ended
    CANCELLED = "cancelled"  # `orch sweep cancel`
    STOPPED = "stopped"  # its max_cost is spent

    @property
    def is_terminal(self) -> bool:
        return self is not SweepState.RUNNING


@dataclass(frozen=True)
class Sweep:
    id: int
    name: str
    state: SweepState
    spec: dict[str, Any]  # the validated [sweep] table, paths resolved, plus the base job's resolved spec
    spec_path: str
    created_at: float
    updated_at: float
    finished_at: Optional[float]
    reason: str
    cancel_requested_at: Optional[float]

    @classmethod
    def from_row(cls, row: Any) -> "Sweep":
        return cls(
            id=row["id"],
            name=row["name"],
            state=SweepState(row["state"]),
            spec=json.loads(row["spec_json"]),
            spec_path=row["spec_path"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            finished_at=row["finished_at"],
            reason=row["reason"],
            cancel_requested_at=row["cancel_requested_at"],
        )


@dataclass(frozen=True)
class Trial:
    sweep_id: int
    number: int  # Optuna's trial number
    job_id: int
    params: dict[str, Any]
    created_at: float

    @classmethod
    def from_row(cls, row: Any) -> "Trial":
        return cls(
            sweep_id=row["sweep_id"],
            number=row["number"],
            job_id=row["job_id"],
            params=json.loads(row["params"]),
            created_at=row["created_at"],
        )
