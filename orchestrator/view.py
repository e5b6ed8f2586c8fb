"""``rankscope view RUN_or_trace.h5``: serve the cross-rank timeline (Panel app) until Ctrl-C.

Prints the URL on one line (``serving <url>``) once the server listens, so scripts can wait for
it. A run directory without ``trace.h5`` is merged first. The analysis behind the findings
column runs once at start (in-process for small runs, on a Dask LocalCluster for large ones).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rankscope.errors import UsageError

#: Default address: local only (the app reads the store; do not expose it by accident).
DEFAULT_ADDRESS = "127.0.0.1"
#: Default port (0 picks a free one).
DEFAULT_PORT = 5006
#: URL path of the app.
APP_PATH = "timeline"


def configure(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``rankscope view`` (import-light)."""
    parser.add_argument("path", type=Path, help="a run directory or a merged trace.h5")
    parser.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"port to listen on (default {DEFAULT_PORT}; 0 picks a free port)",
    )
    parser.add_argument(
        "--address",
        default=DEFAULT_ADDRESS,
        help=f"address to listen on (default {DEFAULT_ADDRESS}; 0.0.0.0 for every interface)",
    )
    parser.add_argument(
        "--show",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="open the app in a web browser (default: only print the URL)",
    )
    parser.add_argument(
        "--no-analysis",
        action="store_true",
        help="skip the analysis (no waits from it, no findings column): starts faster",
    )


def is_loopback(address: str) -> bool:
    """True when ``address`` is reachable from this machine only (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    if address.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name or "": it may resolve to (or mean) any interface


def exposure_warning(address: str, port: int) -> str | None:
    """The warning printed when the app listens beyond loopback (docs/security.md), else None."""
    if is_loopback(address):
        return None
    where = address or "every interface"
    return (
        f"rankscope view: warning: listening on {where} port {port}: anyone who can reach it can "
        "read this run's trace (the app has no login); the default 127.0.0.1 with an SSH tunnel "
        "keeps it private"
    )


def free_port(address: str) -> int:
    """A port that is free on ``address`` right now."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address if address not in ("", "0.0.0.0") else "127.0.0.1", 0))
        return int(s.getsockname()[1])


def _analysis(store_path: Path) -> Any:
    from rankscope.analysis.engine.driver import ClusterSpec
    from rankscope.orchestrator.workflow import run_analysis

    spec = ClusterSpec(main_is_guarded=True)
    return run_analysis(store_path, spec, show_progress=sys.stderr.isatty())


def _overview(store_path: Path) -> Any:
    """The rank × time overview alone (``--no-analysis``): one pass over the ranks."""
    from rankscope.analysis.engine.driver import ClusterSpec
    from rankscope.analysis.engine.overview import overview_of

    return overview_of(store_path, ClusterSpec(main_is_guarded=True))


def main(args: argparse.Namespace) -> int:
    """Entry point of ``rankscope view``: serve until interrupted (Ctrl-C or SIGTERM)."""
    import signal

    from rankscope.analysis.store.reader import open_store
    from rankscope.orchestrator.workflow import resolve_store

    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be 0..65535, got {args.port}")
    store_path = resolve_store(args.path)
    store = open_store(store_path)
    try:
        analysis = None if args.no_analysis else _analysis(store_path)
        overview = _overview(store_path) if args.no_analysis else None
        import panel as pn
        from rankscope.analysis.views.app import APP_TITLE, build_app

        port = args.port or free_port(args.address)
        warning = exposure_warning(args.address, port)
        if warning:
            print(warning, file=sys.stderr, flush=True)
        host = "localhost" if args.address in ("127.0.0.1", "localhost") else args.address
        origins = [f"{host}:{port}", f"127.0.0.1:{port}", f"localhost:{port}"]
        if args.address in ("0.0.0.0", "::", ""):
            origins = ["*"]
        try:
            server = pn.serve(
                {APP_PATH: lambda: build_app(store, analysis, overview)},
                port=port,
                address=args.address,
                websocket_origin=origins,
                show=False,
                start=False,
                title=f"{APP_TITLE} — {store.meta.get('run_id') or store_path.parent.name}",
            )
        except OSError as exc:
            raise UsageError(f"cannot listen on {args.address}:{port} ({exc.strerror})") from None
        url = f"http://{host}:{server.port}/{APP_PATH}"
        print(f"serving {url}  (Ctrl-C to stop)", flush=True)
        loop = server.io_loop
        signal.signal(signal.SIGTERM, lambda *_: loop.add_callback_from_signal(lambda: loop.stop()))
        server.start()
        if args.show:
            loop.add_callback(server.show, "/" + APP_PATH)
        try:
            loop.start()
        except KeyboardInterrupt:
            pass
        finally:
            server.stop()
        print("stopped", flush=True)
    finally:
        store.close()
    return 0
