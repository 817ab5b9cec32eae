"""What every `orch` verb shares: the typer app and its sub-apps, the global options (`Ctx`), the
error-to-exit-code group, and small output helpers. The verb modules import this; app.py wires them."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, NoReturn, Optional

import click
import typer
from typer.core import TyperGroup

from ..contract import ENV_CONFIG
from ..model.errors import OrchError
from ..home.paths import Home


class OrchGroup(TyperGroup):
    """Turns our errors into a message on stderr and an exit code (2 bad input, 1 failed
    request), for the real `orch` and for CliRunner alike: never a traceback."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except OrchError as exc:
            text = str(exc)
            print(text if exc.exit_code == 2 else f"orch: {text}", file=sys.stderr)
            raise typer.Exit(exc.exit_code) from None
        except BrokenPipeError as exc:
            if not _stdout_closed():  # another pipe (a socket): not the reader's doing
                _unexpected(exc)
            # `orch status | head -1`: the reader has what it wanted. Exit as a filter killed by
            # SIGPIPE would (128 + 13), with no report and no second error at the final flush.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise typer.Exit(141) from None
        except Exception as exc:
            if isinstance(exc, (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort)):
                raise  # click's own endings (usage errors, --help, typer.Exit) print themselves
            if not _disk_full(exc):
                _unexpected(exc)
            # SQLite rolls the transaction back: the store is as it was, only this request failed.
            root = _state_root()
            print(
                f"orch: the disk holding {root} is full ({exc}); nothing was recorded. Free space "
                f"(`df -h {root}`, `orch doctor`) and try again",
                file=sys.stderr,
            )
            raise typer.Exit(1) from None


def _unexpected(exc: Exception) -> NoReturn:
    """One line and a private report file, never a traceback (its locals can hold secrets)."""
    from .crash_report import one_line, report_text, write_report

    try:
        root: Optional[Path] = _state_root()
    except Exception:  # noqa: BLE001 - the home may be the very thing that is broken
        root = None
    report, home_problem = write_report(report_text(exc, sys.argv[1:]), root)
    print(one_line(exc, report, home_problem), file=sys.stderr)
    raise typer.Exit(1) from None


def _stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has gone (poll says POLLERR for its write end)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _fd, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no real file descriptor (CliRunner)
        return False


def _state_root() -> Path:
    return Home.locate(ctx.home_arg).root  # the module's Ctx (OrchGroup.invoke's `ctx` is click's)


def _disk_full(exc: Optional[BaseException]) -> bool:
    """ENOSPC, or SQLite's "database or disk is full" — also when a failed ROLLBACK on the full
    disk replaced it with "disk I/O error" (the original is then the exception's context)."""
    import errno
    import sqlite3

    seen = 0
    while exc is not None and seen < 5:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if isinstance(exc, sqlite3.OperationalError) and "full" in str(exc):
            return True
        if isinstance(exc, sqlite3.OperationalError) and "disk I/O error" in str(exc):
            import shutil

            try:  # opening the WAL on a full disk fails this way: tell it by the free space
                return shutil.disk_usage(_state_root()).free < (1 << 20)
            except OSError:
                return False
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


app = typer.Typer(
    cls=OrchGroup,
    pretty_exceptions_show_locals=False,  # the group catches everything; this is the second lock
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    help="orch: queue training jobs on rented GPUs; resume after preemption; count the cost; "
    "get notified; power off when done.",
)
daemon_app = typer.Typer(no_args_is_help=True, help="Run, start, stop or inspect the background daemon.")
notify_app = typer.Typer(no_args_is_help=True, help="Check the notification channels.")
config_app = typer.Typer(no_args_is_help=True, help="Check config.toml.")
app.add_typer(daemon_app, name="daemon")
app.add_typer(notify_app, name="notify")
app.add_typer(config_app, name="config")
storage_app = typer.Typer(no_args_is_help=True, help="Check the [storage] mirror.")
app.add_typer(storage_app, name="storage")


class Ctx:
    home_arg: Optional[str] = None
    config_arg: Optional[str] = None

    @property
    def home(self) -> Home:
        return Home.locate(self.home_arg)

    def store(self):
        from ..store import Store

        home = self.home.ensure()
        return Store(home.db)

    @property
    def config_path(self) -> Path:
        return self.home.config_path(self.config_arg)

    def config(self, *, build_notifiers: bool = False):
        # a file named by --config or ORCH_CONFIG must exist: a typo would drop its prices and notifiers
        required = self.config_arg is not None or bool(os.environ.get(ENV_CONFIG))
        # every channel built and every secret resolved: the one check (jobs/notify.load_config_checked)
        # that `orch submit`, `orch config check` and the daemon's start all make
        if build_notifiers:
            from ..jobs.notify import load_config_checked

            # boot.env's secrets count as set: they are the daemon's environment (`orch daemon
            # install`), and the daemon, `notify test` and `watch` started here build with them
            os.environ.update(self.home.daemon_environ())
            return load_config_checked(self.config_path, required=required)
        from ..spec.config import load_config

        return load_config(self.config_path, required=required)


ctx = Ctx()


def err(text: str) -> None:
    print(text, file=sys.stderr)


def emit_json(data: Any) -> None:
    # Indented for a person at a terminal; compact for a pipe (the indenting encoder is ~4x slower).
    print(json.dumps(data, indent=2 if sys.stdout.isatty() else None, default=str))


def _print_version(value: bool) -> None:
    if value:
        from .. import __version__

        print(f"orch {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    home: Optional[str] = typer.Option(None, "--home", help="State folder (default $ORCH_HOME or ~/.orch)."),
    config: Optional[str] = typer.Option(
        None, "--config", help="config.toml (default $ORCH_CONFIG or $ORCH_HOME/config.toml)."
    ),
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print orch's version and exit."
    ),
) -> None:
    ctx.home_arg, ctx.config_arg = home, config


def daemon_pid(home: Home) -> Optional[int]:
    from ..home.daemon_lock import running_pid

    return running_pid(home)


def poke(home: Home) -> bool:
    from ..home.wake import poke

    return poke(home.wake_socket)


def currency() -> str:
    """The config's currency, peeked at without building the config models (part of `orch
    status`'s budget: spec/currency.py)."""
    from ..spec.currency import configured_currency

    return configured_currency(ctx.config_path)
