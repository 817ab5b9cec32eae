"""Where orch keeps its state: $ORCH_HOME (default ~/.orch) and the files in it. The folder is
0700 and the database 0600: job specs carry [env] values that may be secrets. A home that someone
else owns or may write is refused (they could plant a link or a job there), and a link planted
where a run folder belongs is never followed."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

from ..contract import ENV_CONFIG, ENV_HOME


BOOT_ENV = "boot.env"  # in $ORCH_HOME: see Home.boot_env


@dataclass(frozen=True)
class Home:
    root: Path

    @classmethod
    def locate(cls, home: Optional[str | Path] = None, env: Mapping[str, str] = os.environ) -> "Home":
        value = home or env.get(ENV_HOME) or "~/.orch"
        return cls(Path(os.path.expanduser(str(value))).resolve())

    def ensure(self) -> "Home":
        self._make(self.root)
        self._check_private(self.root)
        runs = self.runs
        if runs.is_symlink():
            # runs/ may be a link to a bigger disk (AutoDL's data disk): only the owner of this
            # private home could have made it, and the folder it names must pass the same checks.
            if not runs.is_dir():
                from ..model.errors import HomeError

                raise HomeError(
                    f"{runs} is a link to {os.readlink(runs)}, which is not a folder: fix or remove the link"
                )
            self._check_private(runs.resolve())
            return self
        self._make(runs)
        self._check_private(runs)
        return self

    def unusable(self) -> Optional[str]:
        """Why this home could not be made or used, looked at without creating anything (for
        `orch doctor`, which only reads): a file where it should be, or a missing folder whose
        nearest existing parent is not a folder this user may write. None when it looks usable."""
        if self.root.exists():
            return None if self.root.is_dir() else f"{self.root} is a file, not a folder"
        parent = self.root.parent
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            return f"{self.root} cannot be created: {parent} is not a folder you can write"
        return None

    def _make(self, folder: Path) -> None:
        """The folder, made 0700 if missing; one line naming it when it cannot be (a file stands
        there, a parent is read-only or not a real filesystem, like /proc)."""
        from ..model.errors import HomeError

        try:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        except FileExistsError:
            raise HomeError(
                f"orch's home {self.root}: {folder} is a file, not a folder; remove it, or set ORCH_HOME "
                "(or --home) to another path"
            ) from None
        except OSError as exc:
            raise HomeError(
                f"orch's home {self.root}: cannot create {folder} ({exc.strerror or exc}); set ORCH_HOME "
                "(or --home) to a folder you can write"
            ) from None

    @staticmethod
    def _check_private(folder: Path) -> None:
        """Ours and closed to others: refused when owned by someone else or writable by group or
        others; a folder of ours that others may only read (an old 0755 home) is tightened to 0700."""
        from ..model.errors import HomeError

        st = os.lstat(folder)
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            raise HomeError(
                f"{folder} is not a folder (a link or a file); orch keeps its state only in a real folder: "
                "remove it, or set ORCH_HOME to another path"
            )
        if st.st_uid != os.geteuid():
            raise HomeError(
                f"{folder} belongs to user id {st.st_uid}, not to you ({os.geteuid()}); whoever owns it can "
                "change what orch runs: use a home of your own (ORCH_HOME=~/.orch), or `chown -R "
                f"$(id -u) {folder}` if it is yours"
            )
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise HomeError(
                f"{folder} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}): they could "
                f"change what orch runs; check nothing was planted in it, then `chmod 700 {folder}`"
            )
        if stat.S_IMODE(st.st_mode) & 0o077:
            os.chmod(folder, 0o700)

    @property
    def db(self) -> Path:
        return self.root / "orch.db"

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    def run_dir(self, job_id: int) -> Path:
        return self.runs / str(job_id)

    def make_run_dir(self, job_id: int) -> Path:
        """runs/<id>, created 0700 if missing; a link or a file planted there is refused, never
        followed (the job's spec, [env] secrets included, is written into it)."""
        from ..model.errors import HomeError

        path = self.run_dir(job_id)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except FileNotFoundError:
            self.ensure()
            os.mkdir(path, 0o700)
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            raise HomeError(
                f"{path} is a link or a file, not a run folder; orch never writes through one: "
                "check who made it, remove it, and run again"
            )
        return path

    @property
    def pid_file(self) -> Path:
        return self.root / "daemon.pid"

    @property
    def daemon_python_file(self) -> Path:
        """The interpreter the last daemon of this home ran with (its built-in jobs run with it):
        `orch submit`'s pre-flight checks a job there, not in whatever Python the CLI has."""
        return self.root / "daemon.python"

    def job_python(self, fallback: str) -> str:
        """The daemon's interpreter as recorded, while it still exists; else `fallback`."""
        try:
            recorded = self.daemon_python_file.read_text().strip()
        except OSError:
            return fallback
        return recorded if recorded and os.access(recorded, os.X_OK) else fallback

    @property
    def lock_file(self) -> Path:
        return self.root / "daemon.lock"

    @property
    def log_file(self) -> Path:
        return self.root / "daemon.log"

    @property
    def wake_socket(self) -> Path:
        return self.root / "wake.sock"

    @property
    def boot_env(self) -> Path:
        """KEY=value lines for a daemon started at boot (`orch daemon install`, a recovery bootstrap):
        the secrets config.toml names with *_env, which no shell environment provides then."""
        return self.root / BOOT_ENV

    def daemon_environ(self, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
        """The environment a daemon of this home sees: `environ` plus boot.env's KEY=value lines
        (what `orch daemon install` starts it with). Checks of the secrets config.toml names by
        *_env use this, so a shell without them can still submit to a daemon that has them."""
        merged = dict(environ)
        try:
            text = self.boot_env.read_text(errors="replace")
        except OSError:
            return merged
        for raw in text.splitlines():
            line = raw.strip()
            if line.startswith("export "):
                line = line[len("export ") :].lstrip()
            if not line or line.startswith("#") or "=" not in line:
                continue
            key, value = line.split("=", 1)
            key, value = key.strip(), value.strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            if key and key not in merged:
                merged[key] = value
        return merged

    def config_path(self, explicit: Optional[str | Path] = None, env: Mapping[str, str] = os.environ) -> Path:
        value = explicit or env.get(ENV_CONFIG)
        return Path(os.path.expanduser(str(value))).resolve() if value else self.root / "config.toml"
