"""`orch daemon install`: start this home's daemon when the machine boots, so queued jobs resume
after a spot instance with the stop behaviour starts again, a VM is restarted or a rented machine
is powered on, without anyone logging in. A systemd unit where systemd is the init (a system unit
as root; a user unit with lingering otherwise), else a crontab `@reboot` line, else a clear "no".

The daemon runs with this interpreter and this home (and config, if one was given), so it is the
same orch that was installed. Secrets the config names by `*_env` come from `<home>/boot.env`
(KEY=VALUE lines, read by systemd and by the cron line), since nothing at boot has your shell's
environment. Detection takes a root folder, so tests run it on a folder of real files."""

from __future__ import annotations

import hashlib
import os
import pwd
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from ..contract import ENV_HOME, atomic_file
from ..model.errors import OrchError
from ..home.paths import Home

SYSTEMD = "systemd"
CRON = "cron"
CRON_DAEMONS = ("cron", "crond", "cronie", "busybox")
STOP_TIMEOUT_S = 150  # `orch daemon stop`'s 120 s for checkpoints, and some


class NoBootStarter(OrchError):
    """Neither systemd nor cron on this machine."""


@dataclass(frozen=True)
class BootPlan:
    kind: str  # SYSTEMD or CRON
    text: str  # the unit file, or the crontab line
    target: str  # the unit's path, or whose crontab
    user_unit: bool = False
    name: str = ""  # the unit's name
    note: str = ""  # what the user should know (a cron daemon not running, lingering)


def systemd_runs(root: Path) -> bool:
    """systemd is the init: it creates /run/systemd/system at boot (sd_booted(3)). A `systemctl`
    binary alone proves nothing: containers often have one and no systemd."""
    return (root / "run/systemd/system").is_dir()


def find_program(name: str, root: Path) -> Optional[str]:
    if root == Path("/"):
        return shutil.which(name)
    for folder in ("usr/local/bin", "usr/bin", "bin", "usr/sbin", "sbin"):
        path = root / folder / name
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return None


def cron_running(root: Path) -> bool:
    """A cron daemon process is up now (in a container nothing may start one at boot)."""
    try:
        entries = list((root / "proc").iterdir())
    except OSError:
        return False
    for entry in entries:
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() in CRON_DAEMONS:
                    return True
            except OSError:
                continue
    return False


def daemon_argv(home: Home, config_path: Optional[Path], python: str = sys.executable) -> list[str]:
    argv = [python, "-m", "orchestrator.cli", "--home", str(home.root)]
    if config_path is not None:
        argv += ["--config", str(config_path)]
    return argv + ["daemon", "run"]


def unit_name(home: Home, default_root: Path) -> str:
    """`orch-daemon.service` for the default home; one per other home, named by its path's hash."""
    if home.root == default_root:
        return "orch-daemon.service"
    return f"orch-daemon-{hashlib.sha1(str(home.root).encode()).hexdigest()[:8]}.service"


def systemd_unit(home: Home, argv: Sequence[str], *, user: Optional[str]) -> str:
    """`user`: run as this account (a system unit); None for a user unit."""
    run_as = f"User={user}\n" if user else ""
    return f"""[Unit]
Description=orch daemon for {home.root}
Wants=network-online.target
After=network-online.target

[Service]
Type=simple
{run_as}Environment={_systemd_quote(f"{ENV_HOME}={home.root}")}
EnvironmentFile=-{home.boot_env}
WorkingDirectory={home.root}
ExecStart={" ".join(_systemd_quote(a) for a in argv)}
# SIGTERM to the daemon only: it checkpoints the running jobs and queues them again.
KillMode=mixed
TimeoutStopSec={STOP_TIMEOUT_S}
Restart=on-failure
RestartSec=30

[Install]
WantedBy={"multi-user.target" if user else "default.target"}
"""


def cron_marker(home: Home) -> str:
    return f"# orch daemon install: {home.root}"


def cron_line(home: Home, argv: Sequence[str]) -> str:
    """One @reboot line: the boot environment file if present, then the daemon in the background
    (`%` is cron's newline, so escaped)."""
    env = shlex.quote(str(home.boot_env))
    err = shlex.quote(str(home.root / "daemon.err"))
    command = (
        f"cd {shlex.quote(str(home.root))} && {{ [ ! -f {env} ] || {{ set -a; . {env}; set +a; }}; }} && "
        f"{ENV_HOME}={shlex.quote(str(home.root))} exec {shlex.join(argv)} >> {err} 2>&1"
    )
    return f"@reboot {command.replace('%', chr(92) + '%')} {cron_marker(home)}"


def merge_crontab(existing: str, line: str, marker: str) -> str:
    """The crontab with exactly one line for this home: an older one (another interpreter) replaced."""
    kept = [row for row in existing.splitlines() if not row.rstrip().endswith(marker)]
    return "\n".join([*kept, line]) + "\n"


def plan(
    home: Home,
    config_path: Optional[Path],
    *,
    root: Path = Path("/"),
    euid: Optional[int] = None,
    user_home: Optional[Path] = None,
    default_root: Optional[Path] = None,
) -> BootPlan:
    """What `install` would do on this machine, or NoBootStarter."""
    euid = os.geteuid() if euid is None else euid
    argv = daemon_argv(home, config_path)
    account = _account(euid)
    if systemd_runs(root):
        name = unit_name(home, default_root or Home.locate(None, env={}).root)
        if euid == 0:
            path = root / "etc/systemd/system" / name
            return BootPlan(SYSTEMD, systemd_unit(home, argv, user=account), str(path), name=name)
        path = (user_home or Path.home()) / ".config/systemd/user" / name
        note = (
            f"a user unit starts at boot only with lingering on: install runs `loginctl enable-linger {account}`"
            " (or run it with sudo)"
        )
        return BootPlan(SYSTEMD, systemd_unit(home, argv, user=None), str(path), True, name, note)
    if find_program("crontab", root):
        note = "" if cron_running(root) else "no cron daemon is running now: the line works only if cron starts at boot"
        return BootPlan(CRON, cron_line(home, argv), f"the crontab of {account}", note=note)
    raise NoBootStarter(
        "nothing on this machine can start the daemon at boot: systemd is not the init (no /run/systemd/system) "
        "and there is no `crontab` command (a container usually has neither). Start it after each boot with "
        "`orch daemon start`, from your provider's start-up hook if it has one (docs/recovery-providers.md), "
        "or install cron and run `orch daemon install` again"
    )


Runner = Callable[[Sequence[str], Optional[str]], tuple[int, str]]  # argv, stdin -> (code, output)


def install(boot: BootPlan, home: Home, run: Runner) -> list[str]:
    """Put the plan in place; idempotent. Returns what was done, one line each; OrchError when a
    step fails."""
    done = []
    if boot.kind == SYSTEMD:
        path = Path(boot.target)
        with atomic_file(path, "w") as unit:  # systemd never reads half a unit (a full disk, a crash)
            unit.write(boot.text)
        done.append(f"wrote {path}")
        scope = ["--user"] if boot.user_unit else []
        for argv in (["systemctl", *scope, "daemon-reload"], ["systemctl", *scope, "enable", boot.name]):
            _must(run, argv, None)
        done.append(f"enabled {boot.name}: the daemon starts at every boot")
        if boot.user_unit:
            user = _account(os.geteuid())
            code, out = run(["loginctl", "enable-linger", user], None)
            done.append(
                f"lingering on for {user}"
                if code == 0
                else f"could not turn lingering on ({out.strip()[:200]}): "
                f"run `sudo loginctl enable-linger {user}`, or the unit starts only at your login"
            )
        return done
    code, current = run(["crontab", "-l"], None)
    existing = current if code == 0 else ""  # exit 1: no crontab yet
    if boot.text in existing.splitlines():
        return [f"the @reboot line is already in {boot.target}"]
    _must(run, ["crontab", "-"], merge_crontab(existing, boot.text, cron_marker(home)))
    return [f"added the @reboot line to {boot.target}"]


def run_command(argv: Sequence[str], stdin: Optional[str]) -> tuple[int, str]:
    import subprocess

    try:
        done = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, f"{type(exc).__name__}: {exc}"
    return done.returncode, done.stdout + done.stderr


def _must(run: Runner, argv: Sequence[str], stdin: Optional[str]) -> None:
    code, out = run(argv, stdin)
    if code != 0:
        raise OrchError(f"`{shlex.join(argv)}` failed (exit {code}): {out.strip()[:300]}")


def _account(euid: int) -> str:
    try:
        return pwd.getpwuid(euid).pw_name
    except KeyError:
        return str(euid)


def _systemd_quote(value: str) -> str:
    if value and not any(c in value for c in " \t\"'\\$%;"):
        return value
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "$$").replace("%", "%%")
    return f'"{escaped}"'
