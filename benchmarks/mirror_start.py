"""How soon the mirror starts an upload: a checkpoint renamed into a job's checkpoint folder (as the
runner writes one) -> the put called, through the daemon's uploader thread (`Mirror.start()`) and
the loopback S3 server (moto, in this process's threads). Each checkpoint appears at a different
phase of the uploader's pass loop; the figure is the wait before the first byte can go out.

    python -m benchmarks.mirror_start [--size-mb 100] [--reps 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=100)
    ap.add_argument("--reps", type=int, default=8)
    args = ap.parse_args()
    from orchestrator.spec.config import Config, StorageSection
    from orchestrator.contract import periodic_name
    from orchestrator.daemon.mirror import Mirror

    from .s3_bench import BUCKET_URL, home_with_a_job, start_s3

    server, endpoint = start_s3()
    tmp = Path(tempfile.mkdtemp(prefix="orch-bench-mirror-start-"))
    src = tmp / "ckpt.bin"
    with open(src, "wb") as f:
        for _ in range(args.size_mb):
            f.write(os.urandom(1_000_000))
    home, store, job, folder = home_with_a_job(tmp / "home", "start")
    mirror = Mirror(home, Config(storage=StorageSection(url=BUCKET_URL, endpoint=endpoint)), store)
    put_called: list[float] = []
    for name in ("put_file_async", "put_file_hashed_async"):  # whichever the uploader uses
        real = getattr(mirror.remote, name, None)
        if real is not None:

            def called(*a: Any, _real: Any = real, **kw: Any) -> Any:
                put_called.append(time.monotonic())
                return _real(*a, **kw)

            setattr(mirror.remote, name, called)
    mirror.start()
    time.sleep(2)
    waits = []
    for i in range(1, args.reps + 1):
        time.sleep(0.5 + (0.37 * i) % 1.0)  # a different phase of the pass loop each time
        put_called.clear()
        tmp_name = folder / f".tmp-{i}"
        os.link(src, tmp_name)
        appeared = time.monotonic()
        os.replace(tmp_name, folder / periodic_name(i))
        while not put_called:
            time.sleep(0.002)
        waits.append(put_called[0] - appeared)
        while store.uploads_pending():
            time.sleep(0.05)
        print(f"rep {i}: the put called {waits[-1]:.3f} s after the checkpoint appeared", flush=True)
    mirror.stop()
    server.stop()
    print(
        json.dumps(
            {
                "checkpoint_mb": args.size_mb,
                "appeared_to_put_s": [round(w, 3) for w in waits],
                "median_s": round(statistics.median(waits), 3),
                "max_s": round(max(waits), 3),
                "load_avg_1min": round(os.getloadavg()[0], 2),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
