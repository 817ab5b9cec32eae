"""`orch doctor` on Ray with a head that does not answer: the finding names the head and gives the
Ray fix (start the cluster, or set [ray] address), not the shared-folder fix -- the folder was never
tried. A real closed loopback port; no Ray needed."""

from __future__ import annotations

import socket


def test_doctor_answers_an_unreachable_ray_head_with_the_ray_fix(orch, home):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    home.mkdir(mode=0o700, exist_ok=True)
    (home / "config.toml").write_text(
        f'[executor]\nkind = "ray"\n[ray]\naddress = "http://127.0.0.1:{port}"\ntimeout_seconds = 2\n'
    )
    ran = orch("doctor", timeout=120)
    assert ran.rc == 1, ran
    text = ran.out + ran.err
    assert "cannot reach the Ray head" in text and f"127.0.0.1:{port}" in text, text
    assert "ray start --head" in text and "[ray] address" in text
    assert "NFS" not in text and "Traceback" not in text
