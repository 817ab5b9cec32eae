"""`orch daemon install [--print]`: a systemd unit where systemd is the init, a crontab @reboot line
where cron exists, a clear "no" elsewhere. Detection runs on a folder of real files standing in for
/; systemctl and crontab are small scripts on PATH that keep their state in files; the @reboot line
itself is run by sh and starts a real daemon with the right home, interpreter and boot.env."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.cli.daemon_install import (
    CRON,
    SYSTEMD,
    NoBootStarter,
    cron_line,
    cron_marker,
    install,
    merge_crontab,
    plan,
    run_command,
)
from orchestrator.home.paths import BOOT_ENV, Home

FAKE_CRONTAB = """#!/bin/sh
# crontab -l / crontab - , keeping the table in $CRONTAB_FILE
if [ "$1" = "-l" ]; then
  [ -f "$CRONTAB_FILE" ] || { echo "no crontab for $(id -un)" >&2; exit 1; }
  cat "$CRONTAB_FILE"
elif [ "$1" = "-" ]; then
  cat > "$CRONTAB_FILE"
else
  exit 2
fi
"""
RECORDING = '#!/bin/sh\necho "$(basename "$0") $*" >> "$CALLS"\n'


def _exe(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    path.chmod(0o755)
    return path


def _systemd_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "run/systemd/system").mkdir(parents=True)
    return root


def _cron_root(tmp_path: Path, running: bool) -> Path:
    root = tmp_path / "root"
    _exe(root / "usr/bin", "crontab", FAKE_CRONTAB)
    if running:
        (root / "proc/4242").mkdir(parents=True)
        (root / "proc/4242/comm").write_text("cron\n")
    return root


def test_print_shows_a_systemd_unit_where_systemd_is_the_init(cli, home, tmp_path):
    root = _systemd_root(tmp_path)
    _exe(root / "usr/bin", "crontab", FAKE_CRONTAB)  # systemd wins over cron

    ran = cli("daemon", "install", "--print", "--root", root)

    assert ran.rc == 0, ran
    assert ran.out.startswith(f"# {root}/etc/systemd/system/orch-daemon-")  # as root: a system unit
    unit = ran.out
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    assert shlex.split(exec_start.removeprefix("ExecStart=")) == [
        sys.executable,
        "-m",
        "orchestrator.cli",
        "--home",
        str(Path(home).resolve()),
        "daemon",
        "run",
    ]
    assert f"Environment=ORCH_HOME={Path(home).resolve()}" in unit
    assert f"EnvironmentFile=-{Path(home).resolve() / BOOT_ENV}" in unit
    assert "KillMode=mixed" in unit and "WantedBy=multi-user.target" in unit
    assert not (root / "etc").exists()  # --print changes nothing


def test_print_shows_the_crontab_line_where_only_cron_exists(cli, home, tmp_path):
    ran = cli("daemon", "install", "--print", "--root", _cron_root(tmp_path, running=True))

    assert ran.rc == 0, ran
    where, line = ran.out.splitlines()
    assert where.startswith("# the crontab of ")
    assert line.startswith("@reboot cd ") and line.endswith(cron_marker(Home(Path(home).resolve())))
    assert f"{shlex.quote(sys.executable)} -m orchestrator.cli --home" in line
    assert ran.err == ""


def test_print_warns_when_no_cron_daemon_runs(cli, tmp_path):
    ran = cli("daemon", "install", "--print", "--root", _cron_root(tmp_path, running=False))

    assert ran.rc == 0
    assert "no cron daemon is running now" in ran.err


def test_neither_systemd_nor_cron_is_a_clear_message_and_exit_1(cli, tmp_path):
    (tmp_path / "root/usr/bin").mkdir(parents=True)
    _exe(tmp_path / "root/usr/bin", "systemctl", "#!/bin/sh\nexit 1\n")  # a binary is not a running systemd

    for args in (["--print"], []):
        ran = cli("daemon", "install", *args, "--root", tmp_path / "root")
        assert ran.rc == 1
        assert "nothing on this machine can start the daemon at boot" in ran.err
        assert "orch daemon start" in ran.err and "Traceback" not in ran.err


def test_a_user_unit_for_someone_else_than_root(tmp_path):
    home = Home(tmp_path / "h").ensure()
    boot = plan(home, tmp_path / "my.toml", root=_systemd_root(tmp_path), euid=os.getuid() + 1, user_home=tmp_path)

    assert boot.kind == SYSTEMD and boot.user_unit
    assert boot.target == str(tmp_path / ".config/systemd/user" / boot.name)
    assert "User=" not in boot.text and "WantedBy=default.target" in boot.text
    assert f"--config {tmp_path / 'my.toml'} daemon run" in boot.text
    assert "enable-linger" in boot.note


def test_systemd_install_writes_the_unit_and_enables_it_idempotently(tmp_path, monkeypatch):
    home = Home(tmp_path / "h").ensure()
    bin_dir = tmp_path / "bin"
    _exe(bin_dir, "systemctl", RECORDING)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("CALLS", str(tmp_path / "calls"))
    boot = plan(home, None, root=_systemd_root(tmp_path), euid=0)

    first = install(boot, home, run_command)
    again = install(boot, home, run_command)

    assert first == again and first[0] == f"wrote {boot.target}"
    assert Path(boot.target).read_text() == boot.text
    assert (tmp_path / "calls").read_text().splitlines() == [
        "systemctl daemon-reload",
        f"systemctl enable {boot.name}",
    ] * 2


def test_cron_install_adds_one_line_and_never_a_duplicate(tmp_path, monkeypatch):
    home = Home(tmp_path / "h").ensure()
    root = _cron_root(tmp_path, running=True)
    table = tmp_path / "crontab"
    monkeypatch.setenv("PATH", f"{root / 'usr/bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("CRONTAB_FILE", str(table))
    boot = plan(home, None, root=root)
    assert boot.kind == CRON

    assert install(boot, home, run_command) == [f"added the @reboot line to {boot.target}"]
    table.write_text("0 3 * * * backup\n" + table.read_text())  # the user's own lines stay
    assert install(boot, home, run_command) == [f"the @reboot line is already in {boot.target}"]

    assert table.read_text().splitlines() == ["0 3 * * * backup", boot.text]


def test_a_line_for_another_interpreter_is_replaced_not_added():
    home = Home(Path("/data/orch home"))
    old = cron_line(home, ["/old/python", "-m", "orchestrator.cli", "daemon", "run"])
    new = cron_line(home, ["/new/python", "-m", "orchestrator.cli", "daemon", "run"])
    other = cron_line(Home(Path("/data/other")), ["/old/python", "daemon", "run"])

    merged = merge_crontab(f"MAILTO=me\n{old}\n{other}\n", new, cron_marker(home))

    assert merged.splitlines() == ["MAILTO=me", other, new]


def test_the_reboot_line_starts_the_daemon_with_this_home_and_boot_env(tmp_path):
    home = Home(tmp_path / "h").ensure()
    (home.root / BOOT_ENV).write_text("ORCH_SMTP_PASSWORD=from-boot-env\n")
    line = plan(home, None, root=_cron_root(tmp_path, running=True)).text
    command = line.removeprefix("@reboot ").replace("\\%", "%")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": os.environ.get("PYTHONPATH", "")}

    proc = subprocess.Popen(["sh", "-c", command], env=env, cwd="/")  # what cron runs at boot
    try:
        deadline = time.monotonic() + 30
        while not (home.root / "daemon.pid").exists() or not (home.root / "daemon.pid").read_text().strip():
            assert proc.poll() is None, (home.root / "daemon.err").read_text()
            assert time.monotonic() < deadline, "the daemon did not start"
            time.sleep(0.1)
        pid = int((home.root / "daemon.pid").read_text())
        assert pid == proc.pid  # exec: cron's child is the daemon itself
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert b"ORCH_SMTP_PASSWORD=from-boot-env" in environ
        assert f"ORCH_HOME={home.root}".encode() in environ
        assert os.readlink(f"/proc/{pid}/exe") == os.path.realpath(sys.executable)
    finally:
        proc.terminate()
        proc.wait(30)


def test_plan_raises_no_boot_starter_on_a_bare_root(tmp_path):
    with pytest.raises(NoBootStarter):
        plan(Home(tmp_path / "h"), None, root=tmp_path)
