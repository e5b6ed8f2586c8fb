"""Input shapes and dtypes as text (``string_codes.text_codes``): the codes and the table of
``str`` per event, with ``str`` called once per distinct value; on real traces recorded with
``record_shapes`` and on decoded JSON values of every kind."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
from rankscope.orchestrator.ingest import decode
from rankscope.orchestrator.ingest.string_codes import codes_in, text_codes

DATA = Path(__file__).parent / "data"
#: Real traces with ``Input Dims`` / ``Input type`` (PARAM's DLRM, record_shapes=True).
SHAPED = sorted((DATA / "param_dlrm_8rank").glob("*.json"))


def _reference(values: list[Any]) -> tuple[np.ndarray, list[str]]:
    """One ``str`` per value: the codes and table the reader produced before text_codes."""
    seen: dict[str, int] = {}
    return codes_in(seen, [str(v) for v in values], np.int32), list(seen)


def _same(values: list[Any]) -> None:
    codes, texts = text_codes(values)
    want_codes, want_texts = _reference(values)
    assert codes.dtype == want_codes.dtype == np.int32
    assert np.array_equal(codes, want_codes)
    assert texts == want_texts


def test_real_shapes_and_dtypes() -> None:
    n = 0
    for path in SHAPED:
        events = decode.decode(path.read_bytes()).traceEvents
        args = [e.args for e in events if e.ph == "X" and e.args is not None]
        dims = [a.input_dims for a in args if a.input_dims is not None]
        kinds = [a.input_type or [] for a in args if a.input_dims is not None]
        assert len(dims) > 1000 and len({str(d) for d in dims}) > 100
        _same(dims)
        _same(kinds)
        n += len(dims)
    assert n > 10_000


def _value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, 1, -1, 2**40, 2**63 - 1, -(2**63)])
    if kind == 3:
        return rng.choice([0.0, -0.0, 1.0, 1.5, 1e16, 1e-7, 2.0**60])
    if kind == 4:
        return rng.choice(["", "float", "c10::Half", "é", 'q"uote', "null", "None", "1"])
    if kind == 5:
        return []
    if kind in (6, 7):
        return [_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(["a", "b", "null"]): _value(rng, depth + 1) for _ in range(2)}


def test_decoded_values_of_every_kind() -> None:
    """Values as JSON decodes them, many alike (so groups form) and some whose ``str`` agree
    while their JSON differs (``1`` and ``"1"``, ``None`` and ``"None"``), in random order."""
    rng = random.Random(7)
    pool = [_value(rng) for _ in range(300)]
    pool += [[1], ["1"], [None], ["None"], [True], ["True"], [1.0], [[]], [[None]], {"a": None}]
    for _ in range(200):
        values = [rng.choice(pool) for _ in range(rng.randrange(1, 60))]
        # through JSON, as the reader gets them (fresh objects per event)
        values = msgspec.json.decode(msgspec.json.encode(values))
        _same(values)
        _same([v for v in values if "null" not in str(msgspec.json.encode(v))])
