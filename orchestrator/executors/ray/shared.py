"""`orch doctor` with [executor] kind = "ray": is $ORCH_HOME/runs on a filesystem every node shares?
A file the daemon's machine writes must be visible to a job on a GPU worker (the run folder, the
checkpoints, the exit record), and one the job writes visible back here. Checked with one tiny Ray
job that asks for a sliver of a GPU (so Ray places it where attempts run, not on a GPU-less head)
and reads and writes one file each way."""

from __future__ import annotations

import secrets
import shlex
import sys
from typing import TYPE_CHECKING, Any

from ...home.paths import Home
from ...host.polling import poll
from .api import RayJob, RayJobsApi, RayUnreachable

if TYPE_CHECKING:
    from ...spec.ray_section import RaySection

PROBE_GPU = 0.01  # enough for Ray to place it on a GPU node; a 1-GPU attempt waits only seconds
PROBE_TIMEOUT_S = 90.0
SHARED_FIX = "put ORCH_HOME on a filesystem every Ray node mounts at the same path (NFS, EFS, Filestore, ...)"
HEAD_FIX = (
    "start the cluster (`ray start --head` on the head node) or set [ray] address to its dashboard URL "
    "(http://HEAD:8265); `ray status` on the head says whether it runs, "
    "`curl http://HEAD:8265/api/version` whether this machine reaches it"
)


def check_shared_with_ray(home: Home, ray: "RaySection", *, python: str = sys.executable) -> tuple[bool, str, str]:
    """(ok, what was found, its fix). Never raises: every failure is the text of the finding. A head
    that does not answer is its own finding, with the Ray fix: the folder was never tried."""
    api = RayJobsApi(ray.address, ray.timeout_seconds, ray.submit_timeout_seconds)
    token = secrets.token_hex(8)
    here = home.runs / f".doctor-{token}"
    there = home.runs / f".doctor-{token}.seen"
    sid = f"orch-doctor-{token}"
    code = (
        "import pathlib, socket\n"
        f"p = pathlib.Path({str(here)!r})\n"
        f"seen = p.exists() and p.read_text() == {token!r}\n"
        f"pathlib.Path({str(there)!r}).write_text(('yes ' if seen else 'no ') + socket.gethostname())\n"
    )
    try:
        home.runs.mkdir(parents=True, exist_ok=True)
        here.write_text(token)
        api.submit(
            {"entrypoint": shlex.join([python, "-c", code]), "submission_id": sid, "entrypoint_num_gpus": PROBE_GPU}
        )
        ended: RayJob | None = poll(lambda: (j := api.job(sid)) is not None and j.ended and j, PROBE_TIMEOUT_S, 0.5)
        if not ended:
            api.stop(sid)
            return (
                False,
                f"the shared-folder probe (Ray job {sid}) did not finish within {PROBE_TIMEOUT_S:.0f} s: no GPU node free?",
                "free a GPU on the cluster (or wait for the running attempts), then run `orch doctor` again",
            )
        answer = there.read_text().split() if there.exists() else []
        if not answer:
            said = f" ({ended.message.strip().splitlines()[-1][:200]})" if ended.message.strip() else ""
            return (
                False,
                f"a job on a Ray GPU node ran ({ended.status}) but its file under {home.runs} never appeared here: "
                f"the nodes do not share ORCH_HOME's runs folder{said}",
                SHARED_FIX,
            )
        if answer[0] != "yes":
            return (
                False,
                f"a job on Ray node {answer[-1]} does not see {here}: the nodes do not share ORCH_HOME's runs folder",
                SHARED_FIX,
            )
        return True, f"{home.runs} is shared with the Ray nodes (a job on {answer[-1]} read and wrote it)", ""
    except RayUnreachable as exc:
        return False, f"cannot reach the Ray head, so the shared folder was not checked: {exc}", HEAD_FIX
    except OSError as exc:
        return False, f"cannot check the shared folder through Ray: {exc}", SHARED_FIX
    finally:
        for path in (here, there):
            try:
                path.unlink()
            except OSError:
                pass


def doctor_check(config: Any, home: Home) -> tuple[str, str, str]:
    """`orch doctor` on Ray (model/executor_kinds.py names it): whether a file the daemon writes is
    visible to a job on a node, and what to do when it is not."""
    ok, text, fix = check_shared_with_ray(home, config.ray)
    return ("ok" if ok else "bad"), text, fix
