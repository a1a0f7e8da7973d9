"""Whether a spawned viewer could open a window: a display variable counts only when a
real socket answers there (an X server's Unix or TCP socket, a Wayland compositor's)."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from otel_proofscope.rerun import display
from otel_proofscope.rerun.display import display_unavailable, x_server_answers

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="abstract Unix sockets are Linux's")


@pytest.fixture(autouse=True)
def _linux(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(display.sys, "platform", "linux")


def _listening_unix(path: str) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    return server


def _free_display_number() -> int:
    """A display number with no X socket of either kind (file or abstract)."""
    for number in range(7301, 7400):
        path = f"/tmp/.X11-unix/X{number}"
        if not os.path.exists(path) and not x_server_answers(f":{number}", 0.05):
            return number
    raise AssertionError("no free display number in 7301-7399")


@pytest.fixture
def x_server() -> Iterator[int]:
    """A listening abstract socket where Xvfb would put display N's (no file needed)."""
    number = _free_display_number()
    server = _listening_unix(f"\0/tmp/.X11-unix/X{number}")
    yield number
    server.close()


def test_no_variables_at_all_says_so_and_suggests_a_file() -> None:
    why = display_unavailable({})
    assert why is not None
    assert "DISPLAY and WAYLAND_DISPLAY are unset" in why and "--rerun file:" in why


def test_a_stale_display_number_is_not_a_display() -> None:
    number = _free_display_number()
    why = display_unavailable({"DISPLAY": f":{number}"})
    assert why is not None
    assert f"DISPLAY=:{number} is set, but nothing accepts connections there" in why
    assert "--rerun file:" in why


@linux_only
def test_a_listening_x_socket_is_a_display(x_server: int) -> None:
    assert display_unavailable({"DISPLAY": f":{x_server}"}) is None
    assert display_unavailable({"DISPLAY": f"unix:{x_server}.0"}) is None  # with a screen


def test_a_remote_display_is_tried_on_its_tcp_port() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    try:
        assert port > 6000
        assert display_unavailable({"DISPLAY": f"127.0.0.1:{port - 6000}"}) is None
    finally:
        server.close()
    why = display_unavailable({"DISPLAY": f"127.0.0.1:{port - 6000}"})
    assert why is not None and "nothing accepts connections" in why


def test_a_wayland_name_resolves_in_the_runtime_dir(tmp_path: Path) -> None:
    env = {"WAYLAND_DISPLAY": "wayland-7", "XDG_RUNTIME_DIR": str(tmp_path)}
    why = display_unavailable(env)
    assert why is not None and "WAYLAND_DISPLAY=wayland-7" in why
    server = _listening_unix(str(tmp_path / "wayland-7"))
    try:
        assert display_unavailable(env) is None
        # An absolute name is used as it is, whatever the runtime dir says.
        assert display_unavailable({"WAYLAND_DISPLAY": str(tmp_path / "wayland-7")}) is None
    finally:
        server.close()
    # A socket file left behind by a compositor that exited answers nothing.
    assert display_unavailable(env) is not None
    # Without a runtime dir a relative name cannot be resolved.
    assert display_unavailable({"WAYLAND_DISPLAY": "wayland-7"}) is not None


def test_either_server_answering_is_enough(tmp_path: Path, x_server: int) -> None:
    env = {"DISPLAY": f":{x_server}", "WAYLAND_DISPLAY": "gone",
           "XDG_RUNTIME_DIR": str(tmp_path)}
    assert display_unavailable(env) is None
    number = _free_display_number()
    both_dead = display_unavailable({"DISPLAY": f":{number}", "WAYLAND_DISPLAY": "gone",
                                     "XDG_RUNTIME_DIR": str(tmp_path)})
    assert both_dead is not None
    assert f"DISPLAY=:{number}, WAYLAND_DISPLAY=gone is set" in both_dead


def test_an_inherited_wayland_socket_and_other_platforms_are_trusted(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert display_unavailable({"WAYLAND_SOCKET": "5"}) is None
    monkeypatch.setattr(display.sys, "platform", "darwin")
    assert display_unavailable({}) is None


@pytest.mark.parametrize("value", ["garbage", ":", "host:x", ":1:2"])
def test_a_malformed_display_value_is_not_a_display(value: str) -> None:
    why = display_unavailable({"DISPLAY": value})
    assert why is not None and f"DISPLAY={value}" in why


def test_the_check_is_bounded_for_an_unroutable_remote_display(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A blackholed TCP display must not stall the spawn for longer than the timeout:
    # the timeout reaches the connect call.
    seen: list[float | None] = []

    def fake_connect(address: tuple[str, int], timeout: float | None = None) -> socket.socket:
        seen.append(timeout)
        raise TimeoutError("timed out")

    monkeypatch.setattr(display.socket, "create_connection", fake_connect)
    assert display_unavailable({"DISPLAY": "192.0.2.1:0"}) is not None
    assert seen == [display.CONNECT_TIMEOUT_S]
