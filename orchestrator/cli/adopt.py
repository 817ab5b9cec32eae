"""`orch adopt URL [--job ID]... [--all] [--force] [--yes] [--gpus N]`: the command's side. The work is in
orchestrator/adopt/; here: show what each job will run and ask (a terminal), or take --yes."""

from __future__ import annotations

import sys
from typing import Any, Callable, Optional, Sequence

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
    wait_s: Optional[float] = None,
    gpus: Optional[int] = None,
) -> int:
    """`wait_s`: `--wait`: a job whose lease another machine holds is tried again every few seconds
    until it is adopted (the holder released it or went silent) or `wait_s` pass. `gpus`:
    `--gpus N`, each job resumed on N GPUs (jobs/regpu.py)."""
    from ..adopt import Refused, adopt_jobs, exit_code
    from ..adopt.candidates import Held
    from ..adopt.pending import wait_loop
    from ..home.wake import poke

    answered: list[bool] = []
    ask = confirmer(yes, sys.stdin.isatty())

    def confirm(lines: list[str]) -> bool:
        answered.append(ask(lines))
        return answered[-1]

    adopted: list[Any] = []
    refused: list[Refused] = []
    wanted, every = list(jobs), take_all

    def attempt() -> bool:
        nonlocal wanted, every, refused
        got, refused = adopt_jobs(
            home,
            config,
            store,
            url,
            wanted=wanted,
            take_all=every,
            force=force,
            say=print,
            warn=lambda text: print(text, file=sys.stderr),
            confirm=confirm,
            maps=list(maps),
            park_held=wait_s is None,
            gpus=gpus,
        )
        adopted.extend(got)
        held = [r.uid for r in refused if isinstance(r, Held)]
        if wait_s is None or not held or (answered and not answered[-1]):
            return True
        wanted, every = held, False
        print(f"waiting for {len(held)} job(s) held by another machine (`--wait`)...", file=sys.stderr)
        return False

    if not wait_loop(attempt, wait_s or 0.0):
        print(f"orch adopt --wait: still held after {wait_s:g} s", file=sys.stderr)
    if adopted and not poke(home.wake_socket):
        print("note: no daemon is running; `orch daemon start` resumes the adopted jobs", file=sys.stderr)
    if answered and not answered[-1]:
        return 2  # nothing was adopted: asked and not confirmed
    return exit_code(adopted, refused)
