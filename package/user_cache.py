"""The user's cache folder of rankscope: ``$XDG_CACHE_HOME/rankscope`` (``~/.cache/rankscope``
without it), the one rule for every cache (stores of read-only traces, compiled templates).

Nothing here creates it: each user makes the part it needs and lives without it where that
fails (a read-only home, a full disk).
"""

from __future__ import annotations

import os
from pathlib import Path

#: The environment variable naming the base of the user's caches (XDG Base Directory).
CACHE_HOME_ENV = "XDG_CACHE_HOME"
#: The base without it (a ``~`` expanded to the user's home).
DEFAULT_CACHE_HOME = "~/.cache"
#: rankscope's folder under the base.
FOLDER = "rankscope"


def cache_home() -> Path:
    """``$XDG_CACHE_HOME`` (``~/.cache`` without it): the base of the user's caches."""
    return Path(os.environ.get(CACHE_HOME_ENV) or str(Path(DEFAULT_CACHE_HOME).expanduser()))


def user_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/rankscope`` (``~/.cache/rankscope`` without it)."""
    return cache_home() / FOLDER
