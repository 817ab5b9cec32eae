"""Where orch keeps its state: $ORCH_HOME (default ~/.orch) and the files in it. The folder is
0700 and the database 0600: job specs carry [env] values that may be secrets."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

from .contract import ENV_CONFIG, ENV_HOME


@dataclass(frozen=True)
class Home:
    root: Path

    @classmethod
    def locate(cls, home: Optional[str | Path] = None, env: Mapping[str, str] = os.environ) -> "Home":
        value = home or env.get(ENV_HOME) or "~/.orch"
        return cls(Path(os.path.expanduser(str(value))).resolve())

    def ensure(self) -> "Home":
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.runs.mkdir(exist_ok=True, mode=0o700)
        return self

    @property
    def db(self) -> Path:
        return self.root / "orch.db"

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    def run_dir(self, job_id: int) -> Path:
        return self.runs / str(job_id)

    @property
    def pid_file(self) -> Path:
        return self.root / "daemon.pid"

    @property
    def lock_file(self) -> Path:
        return self.root / "daemon.lock"

    @property
    def log_file(self) -> Path:
        return self.root / "daemon.log"

    @property
    def wake_socket(self) -> Path:
        return self.root / "wake.sock"

    def config_path(self, explicit: Optional[str | Path] = None, env: Mapping[str, str] = os.environ) -> Path:
        value = explicit or env.get(ENV_CONFIG)
        return Path(os.path.expanduser(str(value))).resolve() if value else self.root / "config.toml"
