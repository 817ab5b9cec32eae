"""`python -m training.preflight --serve SOCKET --owner PID`: the pre-flight kept warm beside the
daemon, so `orch submit` of a built-in job does not pay for importing torch and transformers each
time (seconds) but only for the checks themselves. The daemon starts it (orchestrator/jobs/
preflight_server.py) and it serves one request at a time on a unix socket, each answered exactly
as the one-shot `python -m training.preflight` answers it.

It never answers from a stale state: it exits when its daemon (`--owner`) is gone or replaced,
and before each request it stats every module file it has loaded (our code, transformers, torch,
an upgraded package): one that changed since it started means it answers {"stale": ...} and exits,
and the CLI runs the one-shot pre-flight instead. A request made in another Hugging Face cache
environment than its own is declined the same way ({"declined": ...})."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Any, Optional

from training.ahead.preflight import run

# The environment that decides which cached models and tokenizers a check sees: a request from a
# shell where any differs from this server's is declined (the one-shot pre-flight runs there).
CACHE_ENV = ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE", "XDG_CACHE_HOME")
NOT_STARTED = 3  # the exit of a server that could not import the training stack: not started again
MAX_REQUEST = 64 * 1024 * 1024  # a sweep's distinct trials, resolved: far under this


def cache_env(environ: Any = None) -> dict[str, Optional[str]]:
    env = os.environ if environ is None else environ
    return {key: env.get(key) for key in CACHE_ENV}


def warm_up() -> None:
    """Everything a check may import, imported once now (the checks then import nothing new)."""
    import torch  # noqa: F401
    import transformers
    from transformers import AutoConfig, AutoTokenizer  # noqa: F401

    for name in ("AutoModelForSequenceClassification", "AutoModelForTokenClassification", "AutoModelForCausalLM"):
        getattr(transformers, name)
    try:
        import training.builtin.tasks.lora  # noqa: F401  (peft: only [lora] jobs need it)
    except ImportError:
        pass


def loaded_files() -> dict[str, float]:
    """The modification time of every module file this process has loaded."""
    seen: dict[str, float] = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and path not in seen:
            try:
                seen[path] = os.stat(path).st_mtime
            except OSError:
                continue
    return seen


def changed(files: dict[str, float]) -> Optional[str]:
    """The first loaded module file changed or gone since `files` was taken, or None."""
    for path, mtime in files.items():
        try:
            if os.stat(path).st_mtime != mtime:
                return path
        except OSError:
            return path
    return None


def answer_one(conn: socket.socket, files: dict[str, float], owner: int, number: int) -> bool:
    """Read one request, write one answer (request `number`, said in the daemon's log); False
    when this server must exit (stale)."""
    chunks, size = [], 0
    while True:
        chunk = conn.recv(1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_REQUEST:
            return True
    request = json.loads(b"".join(chunks) or b"{}")
    if not isinstance(request, dict):
        raise ValueError("a request is a JSON object")
    stale = changed(files) or (None if os.getppid() == owner else f"daemon {owner} is gone")
    if stale:
        reply: dict[str, Any] = {"stale": stale}
    elif request.get("cache_env") != cache_env():
        reply = {"declined": "another Hugging Face cache environment than this server's"}
    else:
        reply = run(request)
        reply["python"] = sys.executable
        reply["server"] = os.getpid()
    conn.sendall((json.dumps(reply) + "\n").encode())
    # what the checks imported lazily (a model type's configuration, its tokenizer) is watched too
    files.update({path: mtime for path, mtime in loaded_files().items() if path not in files})
    what = f"stale ({stale}): exiting" if stale else reply.get("declined") or f"answered in {reply['seconds']} s"
    _say(f"request {number}: {what}")
    return not stale


def _say(line: str) -> None:
    print(f"warm pre-flight {os.getpid()}: {line}", flush=True)  # stdout is the daemon's log


def serve(socket_path: Path, owner: int) -> int:
    try:
        warm_up()
    except ImportError as exc:  # a daemon's Python without the training stack: submits run the one-shot
        _say(f"not started: {exc}")
        return NOT_STARTED
    files = loaded_files()
    try:
        os.unlink(socket_path)
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(socket_path))
    os.chmod(socket_path, 0o600)
    ours = os.stat(socket_path).st_ino  # a newer server may bind the same path: leave its socket be
    listener.listen(8)
    listener.settimeout(1.0)
    _say(f"ready on {socket_path} ({sys.executable})")
    served = 0
    try:
        while os.getppid() == owner:  # the daemon gone (or replaced): so is this server
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                continue
            served += 1
            with conn:
                conn.settimeout(60.0)
                try:
                    if not answer_one(conn, files, owner, served):
                        return 0
                except (OSError, ValueError):  # a client gone mid-request, or one that sent no JSON
                    continue
                except Exception as exc:  # a check's own failure: the CLI runs the one-shot, which notes it
                    _say(f"request {served} failed ({type(exc).__name__}: {exc}); the CLI runs the one-shot pre-flight")
        return 0
    finally:
        listener.close()
        try:
            if os.stat(socket_path).st_ino == ours:
                os.unlink(socket_path)
        except OSError:
            pass


def serve_main(argv: list[str]) -> int:
    import logging
    import signal
    import warnings

    # a Ctrl-C at a foreground `orch daemon run` reaches its whole process group: the daemon
    # stops this server itself (SIGTERM), after its jobs
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    socket_path, owner = Path(argv[argv.index("--serve") + 1]), int(argv[argv.index("--owner") + 1])
    return serve(socket_path, owner)
