"""A home deeper than a socket address can hold (107 bytes: a long $ORCH_HOME, a recovery
machine's folder under a test's tmp_path) still gets its wake socket: the daemon binds it through
its folder's descriptor and the CLI reaches it the same way. Before, bind raised and the daemon died
at start, so the machine adopted its job and never ran it (found by mirror/test_aws_zones_e2e)."""

from __future__ import annotations

from orchestrator.home.wake import COUNTERS, MAX_UNIX_PATH, listen, poke


def test_a_socket_in_a_folder_deeper_than_an_address_is_bound_and_reached(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    sock_path = deep / "wake.sock"
    assert len(str(sock_path)) > MAX_UNIX_PATH + 10
    server = listen(sock_path)
    try:
        assert sock_path.exists()
        assert poke(sock_path, COUNTERS)
        server.settimeout(5)
        what, _ = server.recvfrom(64)
        assert what == COUNTERS
    finally:
        server.close()


def test_no_listener_in_a_deep_folder_is_a_plain_false(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    assert poke(deep / "wake.sock") is False
