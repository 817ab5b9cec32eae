"""What the mirror benchmarks share: a loopback S3 server (moto, in this process's threads) with
the bucket `orch-bench`, and a home holding one command job whose checkpoint folder the mirror
watches."""

from __future__ import annotations

import logging
import os
import socket
import time
import urllib.request
from pathlib import Path
from typing import Any

BUCKET_URL = "s3://orch-bench/m"


def start_s3() -> tuple[Any, str]:
    """(the running server, its endpoint URL); stop it with `server.stop()`."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_REGION="us-east-1")
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/orch-bench", method="PUT")).read()
    return server, endpoint


def home_with_a_job(root: Path, name: str) -> tuple[Any, Any, Any, Path]:
    """(home, store, job, the job's checkpoint folder, created) under `root`."""
    from orchestrator.home.paths import Home
    from orchestrator.store import Store

    home = Home(root).ensure()
    store = Store(home.db)
    job = store.submit(
        name=name,
        kind="command",
        gpus=0,
        priority=0,
        retries=0,
        spec={"command": ["true"]},
        spec_path="",
        now=time.time(),
    )
    folder = home.run_dir(job.id) / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    return home, store, job, folder
