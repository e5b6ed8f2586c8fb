"""Headless Chromium as the browser tests start it (Debian's chromium, no network of its own)."""

from __future__ import annotations

import shutil

#: The browser, or None (the browser tests skip without it).
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

#: Headless, as root, and without the background services that would try to reach the network
#: (on this machine's closed network they fail many at a time and slow every start).
HEADLESS_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def unresolvable_hosts(*, except_localhost: bool = False) -> str:
    """Flag making every host name unresolvable: a page that needs the network comes out broken."""
    rule = "MAP * ~NOTFOUND, EXCLUDE localhost" if except_localhost else "MAP * ~NOTFOUND"
    return f"--host-resolver-rules={rule}"
