"""`orch adopt URL [--job ID]... [--all] [--force] [--yes]`: the command's side. The work is in
orchestrator/adopt/; here: show what each job will run and ask (a terminal), or take --yes."""

from __future__ import annotations

import sys
from typing import Any, Callable, Sequence

NO_TERMINAL = (
    "orch adopt: not adopting: these jobs run their command on this machine with the daemon's "
    "environment, and there is no terminal to ask on; read the list above, then add --yes"
)


def confirmer(yes: bool, interactive: bool, ask: Callable[[str], str] = input) -> Callable[[list[str]], bool]:
    def confirm(lines: list[str]) -> bool:
        print(f"{'adopting' if yes else 'to adopt'} (each runs here, with this machine's credentials):")
        for line in lines:
            print(line)
        if yes:
            return True
        if not interactive:
            print(NO_TERMINAL, file=sys.stderr)
            return False
        try:
            answer = ask("adopt and run these jobs here? [y/N] ")
        except EOFError:
            answer = ""
        if answer.strip().lower() in ("y", "yes"):
            return True
        print("not adopted", file=sys.stderr)
        return False

    return confirm


def run_adopt(
    home: Any,
    config: Any,
    store: Any,
    url: str,
    *,
    jobs: list[str],
    take_all: bool,
    force: bool,
    maps: Sequence[str] = (),
    yes: bool = False,
) -> int:
    from ..adopt import adopt_jobs, exit_code
    from ..home.wake import poke

    answered: list[bool] = []
    ask = confirmer(yes, sys.stdin.isatty())

    def confirm(lines: list[str]) -> bool:
        answered.append(ask(lines))
        return answered[-1]

    adopted, refused = adopt_jobs(
        home,
        config,
        store,
        url,
        wanted=jobs,
        take_all=take_all,
        force=force,
        say=print,
        warn=lambda text: print(text, file=sys.stderr),
        confirm=confirm,
        maps=list(maps),
    )
    if adopted and not poke(home.wake_socket):
        print("note: no daemon is running; `orch daemon start` resumes the adopted jobs", file=sys.stderr)
    if answered and not answered[-1]:
        return 2  # nothing was adopted: asked and not confirmed
    return exit_code(adopted, refused)
