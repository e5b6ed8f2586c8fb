"""The promises of docs/security.md, one test (or more) each."""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import socket
import threading
from pathlib import Path

import pytest
from rankscope.errors import UsageError
from rankscope.launchers import clocksync
from rankscope.launchers.base import create_run_dir
from rankscope.orchestrator import view
from rankscope.orchestrator.ingest.merge import merge_run_dir

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["package", "orchestrator", "launchers", "analysis", "slurm"]
STRAGGLER = Path(__file__).parent / "data" / "cpu_gloo_4rank_straggler"

#: Calls that would run or unpickle what they read (module attribute or bare name).
FORBIDDEN_CALLS = {
    ("pickle", "load"), ("pickle", "loads"), ("pickle", "Unpickler"), ("cloudpickle", "loads"),
    ("marshal", "load"), ("marshal", "loads"), ("shelve", "open"), ("dill", "loads"),
    ("yaml", "load"), ("yaml", "unsafe_load"), ("torch", "load"), ("pd", "read_pickle"),
    ("pandas", "read_pickle"), ("jsonpickle", "decode"), (None, "eval"), (None, "exec"),
    (None, "compile"), (None, "__import__"),
}  # fmt: skip


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def test_nothing_read_is_unpickled_or_evaluated() -> None:
    """No pickle/marshal/eval/exec in rankscope's own code; numpy loads refuse pickles."""
    found = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            key = (
                (f.value.id if isinstance(f.value, ast.Name) else None, f.attr)
                if isinstance(f, ast.Attribute)
                else (None, f.id)
                if isinstance(f, ast.Name)
                else None
            )
            if key in FORBIDDEN_CALLS:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {key}")
            if key is not None and key[1] == "load" and key[0] in ("np", "numpy"):
                for kw in node.keywords:
                    if kw.arg == "allow_pickle" and not (
                        isinstance(kw.value, ast.Constant) and kw.value.value is False
                    ):
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno}: allow_pickle")
    assert found == [], found
    assert _sources(), "the scan found no sources"


@pytest.mark.parametrize(
    "name", ["../escape", "a/b", "..", "/abs", "x\\y", ".hidden", "a\x00b", ""]
)
def test_run_name_cannot_escape_the_output_folder(tmp_path: Path, name: str) -> None:
    out = tmp_path / "out"
    with pytest.raises(UsageError, match="--name"):
        create_run_dir(out, name)
    assert sorted(p.name for p in tmp_path.iterdir()) in ([], ["out"])
    assert not out.exists() or list(out.iterdir()) == []


@pytest.mark.parametrize("name", ["train", "my run", "模型", "a.b-c_d"])
def test_run_folder_stays_inside_the_output_folder(tmp_path: Path, name: str) -> None:
    out = tmp_path / "out"
    run = create_run_dir(out, name)
    assert run.parent == out.resolve()


def test_merge_writes_only_its_output_and_honours_the_umask(tmp_path: Path) -> None:
    for r in range(2):
        shutil.copy2(STRAGGLER / f"rank{r}.step5.pt.trace.json", tmp_path)
    before = {p.name for p in tmp_path.iterdir()}
    old = os.umask(0o027)
    try:
        out = merge_run_dir(tmp_path, quiet=True, scheduler="synchronous")
    finally:
        os.umask(old)
    assert {p.name for p in tmp_path.iterdir()} - before == {"trace.h5"}
    assert out.stat().st_mode & 0o777 == 0o640


# -- the Panel server ------------------------------------------------------------------------------


def test_view_listens_on_loopback_by_default() -> None:
    parser = argparse.ArgumentParser()
    view.configure(parser)
    args = parser.parse_args(["run"])
    assert args.address == "127.0.0.1"
    assert view.is_loopback(args.address)


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.1.1", "localhost", "::1", "[::1]"])
def test_view_does_not_warn_on_loopback(address: str) -> None:
    assert view.exposure_warning(address, 5006) is None


@pytest.mark.parametrize("address", ["0.0.0.0", "::", "", "10.1.2.3", "myhost.example.com"])
def test_view_warns_beyond_loopback(address: str) -> None:
    warning = view.exposure_warning(address, 5006)
    assert warning is not None and "warning" in warning and "no login" in warning


def test_view_prints_the_warning_before_serving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import panel as pn

    for r in range(2):
        shutil.copy2(STRAGGLER / f"rank{r}.step5.pt.trace.json", tmp_path)
    merge_run_dir(tmp_path, quiet=True, scheduler="synchronous")
    seen: dict[str, object] = {}

    def fake_serve(*args: object, **kwargs: object) -> None:
        seen.update(kwargs)
        raise OSError(98, "Address already in use")  # stop before anything listens

    monkeypatch.setattr(pn, "serve", fake_serve)
    parser = argparse.ArgumentParser()
    view.configure(parser)
    args = parser.parse_args([str(tmp_path), "--address", "0.0.0.0", "--no-analysis"])
    with pytest.raises(UsageError, match="cannot listen"):
        view.main(args)
    assert "listening on 0.0.0.0" in capsys.readouterr().err
    assert seen["address"] == "0.0.0.0" and seen["show"] is False
    args = parser.parse_args([str(tmp_path), "--no-analysis"])
    with pytest.raises(UsageError):
        view.main(args)
    assert "warning" not in capsys.readouterr().err
    assert seen["address"] == "127.0.0.1"


# -- the clock-sync listener ------------------------------------------------------------------------


def _serve(
    token: bytes, leaders: list[int], accept_s: float = 3.0
) -> tuple[int, dict, threading.Thread]:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    result: dict[int, socket.socket] = {}

    def run() -> None:
        try:
            result.update(clocksync._accept(server, leaders, 5.0, token, accept_timeout_s=accept_s))
        finally:
            server.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return port, result, thread


def _refused(sock: socket.socket) -> bool:
    """True when rank 0 closed the connection (recv sees EOF or a reset)."""
    sock.settimeout(5.0)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_clock_sync_refuses_a_client_without_the_token() -> None:
    token = os.urandom(clocksync.TOKEN_BYTES)
    port, conns, thread = _serve(token, leaders=[2, 3])
    stranger = socket.create_connection(("127.0.0.1", port))
    stranger.sendall(clocksync.PING.pack(2))  # the old hello: a rank only
    wrong = socket.create_connection(("127.0.0.1", port))
    wrong.sendall(os.urandom(clocksync.TOKEN_BYTES) + clocksync.PING.pack(3))
    assert _refused(wrong)
    not_a_leader = socket.create_connection(("127.0.0.1", port))
    not_a_leader.sendall(token + clocksync.PING.pack(1))
    assert _refused(not_a_leader)
    good = clocksync._connect(["127.0.0.1"], port, 3, 5.0, token)
    assert good is not None
    twice = socket.create_connection(("127.0.0.1", port))
    twice.sendall(token + clocksync.PING.pack(3))
    assert _refused(twice)
    leader2 = clocksync._connect(["127.0.0.1"], port, 2, 5.0, token)
    assert leader2 is not None
    thread.join(10)
    assert not thread.is_alive()
    assert sorted(conns) == [2, 3]
    assert _refused(stranger)  # its incomplete hello timed out (HELLO_TIMEOUT_S)
    for s in (stranger, wrong, not_a_leader, good, twice, leader2, *conns.values()):
        s.close()


def test_clock_sync_listener_gives_up_after_its_timeout() -> None:
    """Nobody (or only strangers) connecting: the listener closes after its accept timeout."""
    token = os.urandom(clocksync.TOKEN_BYTES)
    port, conns, thread = _serve(token, leaders=[1], accept_s=0.5)
    silent = socket.create_connection(("127.0.0.1", port))  # connects, never says hello
    thread.join(5)
    assert not thread.is_alive() and conns == {}
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    silent.close()


def test_clock_sync_constants_are_bounded() -> None:
    assert clocksync.TOKEN_BYTES >= 16
    assert clocksync.ACCEPT_TIMEOUT_S <= 60 and clocksync.HELLO_TIMEOUT_S <= 5
