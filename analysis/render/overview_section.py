"""The HTML report's overview section: every rank over time as one inline PNG (drawn here; the
section's markup is ``templates/overview.html.j2``).

The same aggregation as the app's overview (:func:`rankscope.analysis.engine.overview.raster`: each
pixel the share-weighted mix of the category colours of the time it covers, ranks summed into
pixel rows when there are more ranks than rows, nothing dropped), written as a PNG here
(:func:`png_rgb`, zlib only) so the report stays one offline file. Rows are in straggler order
(flagged first, then by the wait each rank caused); a strip left of the image marks the rows
holding a flagged rank (red).
"""

from __future__ import annotations

import base64
import struct
import zlib
from typing import TYPE_CHECKING, Any

from rankscope.analysis.engine.overview import (
    CATEGORY_COLORS,
    CATEGORY_LABELS,
    Category,
    RankOrder,
    flagged_rows,
    rank_order,
    raster,
    row_layout,
    to_rgb,
)

if TYPE_CHECKING:
    from rankscope.analysis.engine.driver import Analysis

#: Width of the image (pixel columns), px.
IMAGE_WIDTH = 900
#: Height of the image at most, px (more ranks share pixel rows, summed).
MAX_HEIGHT = 512
#: Height per rank for few ranks, px.
RANK_PX = 10
#: Width of the flag strip left of the image, px.
STRIP_PX = 10
#: zlib level of the PNG's pixel data: level 6 with the better of two row filters is as small
#: as Pillow's ``optimize`` (level 9, adaptive filters) within ~5 % on the reports measured,
#: in a fraction of its time (512 rows: ~14 ms against 49 ms; docs/performance.md).
PNG_LEVEL = 6
#: PNG row filter types tried (the smaller output kept): None (long runs of one colour along a
#: row) and Up (the image's rows are stretched, so most rows repeat the one above).
PNG_FILTER_NONE, PNG_FILTER_UP = 0, 2
#: A PNG file's first bytes.
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: Strip colours: a row without / with a flagged rank.
PLAIN_RGB = (0xEE, 0xEE, 0xEE)
FLAG_RGB = (0xD6, 0x27, 0x28)


def overview_png(a: Analysis) -> tuple[bytes, dict[str, float]] | None:
    """The PNG and what it shows (ranks, rows, ranks per row, ms span, µs per column); None
    without an overview."""
    import numpy as np

    ov = a.overview
    if ov is None or len(ov.ranks) == 0:
        return None
    order = rank_order(ov, a, RankOrder.STRAGGLER)
    n = len(order)
    height = max(RANK_PX, min(MAX_HEIGHT, RANK_PX * n))
    flagged = set(a.flagged_ranks())
    magnify = flagged_rows(ov, order, list(flagged))
    r = raster(ov, order, width=IMAGE_WIDTH, rows=row_layout(n, height, magnify))
    rgb = to_rgb(r)
    # stretch rows to the image height (each pixel row repeated: a bigger pixel, never a blend)
    rows = np.repeat(
        np.arange(len(rgb)), np.diff(np.floor(np.linspace(0, height, len(rgb) + 1)).astype(int))
    )
    body = rgb[rows]
    strip = np.zeros((len(rgb), STRIP_PX, 3), np.uint8)
    strip[:] = PLAIN_RGB
    for g in range(len(rgb)):
        lo, hi = int(r.rows.lo[g]), int(r.rows.hi[g])
        if any(int(ov.ranks[i]) in flagged for i in order[lo:hi]):
            strip[g] = FLAG_RGB
    gap = np.full((len(body), 2, 3), 255, np.uint8)
    img = np.concatenate([strip[rows], gap, body], axis=1)
    info = {
        "ranks": float(n),
        "ranks_per_row": float(r.ranks_per_row),
        "span_ms": (int(r.x_edges_ns[-1]) - int(r.x_edges_ns[0])) / 1e6,
        "column_us": r.bins_per_column * ov.grid.bin_ns / 1e3,
    }
    return png_rgb(img), info


def png_rgb(img: Any) -> bytes:
    """A PNG of ``img`` (uint8, height × width × 3, RGB): 8-bit truecolour, no interlace, each
    row filtered None or all rows Up, whichever compresses smaller (:data:`PNG_LEVEL`).

    Written here rather than with Pillow: Pillow's import and its format plugins' registration
    cost ~25 ms of every report (a tenth of the report phase on a small job), and its
    ``optimize`` a slow level-9 search; the file is the same image (decoded pixels equal, test).
    """
    import numpy as np

    height, width, _ = img.shape
    rows = np.ascontiguousarray(img, dtype=np.uint8).reshape(height, width * 3)
    up = rows.copy()
    up[1:] -= rows[:-1]  # uint8: modulo 256, as PNG's Up filter is defined
    best = b""
    for kind, data in ((PNG_FILTER_NONE, rows), (PNG_FILTER_UP, up)):
        lines = np.empty((height, width * 3 + 1), np.uint8)
        lines[:, 0] = kind
        lines[:, 1:] = data
        packed = zlib.compress(lines.tobytes(), PNG_LEVEL)
        if not best or len(packed) < len(best):
            best = packed
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8 bit RGB, no interlace
    return PNG_SIGNATURE + _chunk(b"IHDR", header) + _chunk(b"IDAT", best) + _chunk(b"IEND", b"")


def _chunk(kind: bytes, data: bytes) -> bytes:
    """One PNG chunk: length, type, data, CRC-32 of type and data."""
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def overview_view(a: Analysis) -> dict[str, Any] | None:
    """What the section (``templates/overview.html.j2``) shows; None without an overview."""
    got = overview_png(a)
    if got is None:
        return None
    png, info = got
    flagged = a.flagged_ranks()
    return {
        "src": base64.b64encode(png).decode("ascii"),
        "legend": [{"colour": CATEGORY_COLORS[c], "label": CATEGORY_LABELS[c]} for c in Category],
        "ranks": f"{int(info['ranks']):,}",
        "span_ms": f"{info['span_ms']:,.1f}",
        "column_us": f"{info['column_us']:,.1f}",
        "ranks_per_row": int(info["ranks_per_row"]) if info["ranks_per_row"] > 1 else None,
        "flagged": ", ".join(map(str, flagged)) if flagged else None,
    }
