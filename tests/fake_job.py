"""The daemon tests' command job (tests/daemon_harness.py copies it into each $ORCH_HOME): driven
by a JSON behaviour in argv[1] — record start/end to a shared jsonl file, wait for a release file,
trap SIGTERM, write a checkpoint, exit with a code — each optionally per attempt."""

import json
import os
import signal
import sys
import time

spec = json.loads(sys.argv[1])
attempt = os.environ.get("ORCH_ATTEMPT", "0")
b = dict(spec)
b.update(spec.get("per_attempt", {}).get(attempt, {}))
name, folder = b["name"], b["dir"]
tag = f"{name}#{attempt}"


def record(event, **kw):
    line = json.dumps(
        {"name": name, "attempt": int(attempt), "event": event, "t": time.time(), "pid": os.getpid(), **kw}
    )
    fd = os.open(os.path.join(folder, "record.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.write(fd, (line + "\n").encode())
    os.close(fd)


if "on_term" in b:

    def on_term(signum, frame):
        record("sigterm")
        open(os.path.join(folder, f"term-{tag}"), "w").close()
        time.sleep(b.get("term_delay", 0))  # a slow checkpoint
        if b.get("notice_ckpt") is not None:
            ck = os.environ["ORCH_CKPT_DIR"]
            open(os.path.join(ck, "notice-step-%08d.ckpt" % b["notice_ckpt"]), "w").write("x")
        if b["on_term"] is not None:
            print(f"{tag} got SIGTERM, exiting {b['on_term']}", flush=True)
            os._exit(b["on_term"])

    signal.signal(signal.SIGTERM, on_term)

keys = [
    "ORCH_JOB_ID",
    "ORCH_ATTEMPT",
    "ORCH_RUN_DIR",
    "ORCH_CKPT_DIR",
    "ORCH_RESUME_FROM",
    "CUDA_VISIBLE_DEVICES",
] + b.get("env_keys", [])
record("start", env={k: os.environ.get(k) for k in keys}, cwd=os.getcwd())
print(f"{tag} says hello on stdout", flush=True)
print(f"{tag} says hello on stderr", file=sys.stderr, flush=True)
if b.get("ckpt") is not None:
    ck = os.environ["ORCH_CKPT_DIR"]
    with open(os.path.join(ck, "step-%08d.ckpt" % b["ckpt"]), "w") as f:
        f.write("x")
if b.get("hold"):
    release = os.path.join(folder, "release-" + b["hold"])
    deadline = time.time() + 120
    while not os.path.exists(release) and time.time() < deadline:
        time.sleep(0.02)
if b.get("sleep"):
    time.sleep(b["sleep"])
for line in b.get("print", []):
    print(line, flush=True)
record("end")
if b.get("self_signal"):
    os.kill(os.getpid(), b["self_signal"])
    time.sleep(5)
sys.exit(b.get("exit", 0))
