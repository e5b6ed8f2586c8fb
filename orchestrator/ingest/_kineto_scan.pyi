"""The compiled scanner (``_kineto_scan.c``): see ``kineto_scan.py``."""

from typing import Any

def scan(
    text: bytes | bytearray | memoryview,
    pid_block: int,
    ts_limit_us: float,
    exact_limit_us: float,
    memory_limits: tuple[int, ...],
) -> tuple[Any, ...] | None: ...
def scan_start(
    text: bytes | bytearray | memoryview,
    spans: list[tuple[int, int]],
    pid_block: int,
    ts_limit_us: float,
    exact_limit_us: float,
    memory_limits: tuple[int, ...],
) -> object: ...
def scan_take(batch: object, i: int) -> tuple[Any, ...] | None: ...
def scan_finish(batch: object) -> None: ...
