"""The Jinja2 environment the HTML pages are rendered with, and the plain structures its shared
macros take.

The markup of the HTML report and of the comparison's page lives in ``templates/*.html.j2``
(package data, shipped in the wheel); the Python renderers compute the rows, figures and words and
pass plain values (the SVG charts, drawn in Python, as ``Markup``). One environment, built once:
templates loaded from the installed package, ``StrictUndefined`` (a name a template uses and the
renderer did not pass fails the render instead of printing nothing), ``trim_blocks`` and
``lstrip_blocks`` (a line holding only a ``{% %}`` tag prints nothing).

Escaping: autoescape is on and every value a template prints with ``{{ }}`` is escaped exactly
once, by :func:`html.escape` (``finalize``), so user-controlled text (op names, paths, run ids,
finding text) prints with the same entities as before the templates (``&#x27;``, ``&quot;``);
a value that is already markup (a macro's output, an SVG chart passed as ``Markup``) prints as is.

The compiled templates are kept in the user's cache (:func:`bytecode_cache`), so a process
that writes a report does not compile them again.

Jinja2 is imported inside the functions: a command that renders no HTML (``rankscope --help``)
never loads it.
"""

from __future__ import annotations

import contextlib
import functools
from html import escape as _html_escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    import jinja2
    from markupsafe import Markup
    from rankscope.analysis.compute.finding import Finding

#: The package whose ``templates`` folder holds the templates.
PACKAGE = "rankscope.analysis.render"
#: The folder inside :data:`PACKAGE`.
FOLDER = "templates"
#: How every template's name ends (pyproject's package-data ships ``templates/*`` + this).
SUFFIX = ".html.j2"
#: Folder, under the user's cache, of the templates' compiled code (:func:`bytecode_cache`).
BYTECODE_SUBDIR = "templates"


def _escape_once(markup: type[Markup]) -> Callable[[Any], Any]:
    """``finalize``: a value not yet markup is escaped by :func:`html.escape`, once (``markup``:
    markupsafe's ``Markup``, imported with Jinja2 by :func:`environment`).

    Why a function made once with its imports bound rather than one importing them on each
    call: a report prints ~3,400 values, and the two ``import`` statements per value were about
    a third of the finalizer's time."""

    def finalize(value: Any) -> Any:
        if type(value) is str:  # most values: a str has no ``__html__``
            return markup(_html_escape(value))
        if hasattr(value, "__html__"):
            return value
        return markup(_html_escape(str(value)))

    return finalize


def bytecode_dir() -> Path:
    """Where the templates' compiled code is kept between processes: the user's cache
    (``rankscope.user_cache``), :data:`BYTECODE_SUBDIR`."""
    from rankscope.user_cache import user_cache_dir

    return user_cache_dir() / BYTECODE_SUBDIR


def bytecode_cache() -> jinja2.BytecodeCache | None:
    """Jinja2's file cache of compiled templates in :func:`bytecode_dir`, made where missing (as
    the umask says); None where it cannot be made (a read-only home: the templates are then
    compiled in each process, as without a cache).

    Why: compiling the report's templates (parse, generate Python, ``compile``) was ~0.1 s of
    CPU in every process that writes a report. Jinja2 keys each entry by the template's name
    and a checksum of its source, and its header by Jinja2's and Python's versions, so an
    edited template or an upgrade compiles afresh. A cache that cannot be read or written never
    fails a report: a file that cannot be read or holds no code is a miss (compiled again), one
    that cannot be written (a full disk, a read-only folder) is skipped."""
    import types

    import jinja2

    class _Cache(jinja2.FileSystemBytecodeCache):
        def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
            try:
                super().load_bytecode(bucket)
            except (OSError, ValueError, TypeError, EOFError):
                bucket.reset()
            if bucket.code is not None and not isinstance(bucket.code, types.CodeType):
                bucket.reset()

        def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
            with contextlib.suppress(OSError):  # not kept: compiled again next time
                super().dump_bytecode(bucket)

    folder = bytecode_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    if not folder.is_dir():
        return None
    return _Cache(str(folder))


@functools.cache
def environment() -> jinja2.Environment:
    """The one environment (built on first use, then cached)."""
    import jinja2
    from markupsafe import Markup

    return jinja2.Environment(
        loader=jinja2.PackageLoader(PACKAGE, FOLDER),
        bytecode_cache=bytecode_cache(),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        finalize=_escape_once(Markup),
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def template_names() -> list[str]:
    """Every template of the package (``*.html.j2``), sorted."""
    return sorted(n for n in environment().list_templates() if n.endswith(SUFFIX))


def render(template: str, /, **context: Any) -> str:
    """``template`` rendered with ``context`` (jinja2's ``UndefinedError`` when the template
    uses a name ``context`` lacks)."""
    return environment().get_template(template).render(**context)


def markup(text: str) -> Markup:
    """``text`` (markup made in Python: an SVG chart) to be printed as is."""
    from markupsafe import Markup

    return Markup(text)


def table(
    headers: list[str],
    rows: list[list[Any]],
    left: set[int] | None = None,
    wrap: set[int] | None = None,
) -> dict[str, Any]:
    """What the ``table`` macro (``_macros.html.j2``) takes: the headers, the rows (cells
    printed as ``str``) and each column's CSS class (``l``: left-aligned, ``wrap``: wrapped)."""
    left, wrap = left or set(), wrap or set()
    classes = [
        " ".join(c for c, on in (("l", i in left), ("wrap", i in wrap)) if on)
        for i in range(len(headers))
    ]
    return {"headers": headers, "rows": rows, "classes": classes}


def finding(f: Finding, cls: str = "") -> dict[str, str]:
    """What the ``finding`` macro takes: its CSS classes (``finding``, its severity, ``cls``),
    the headline (bold) and the rest of its one-line form."""
    classes = " ".join(c for c in ("finding", f"sev-{f.severity}", cls) if c)
    return {"classes": classes, "headline": f.headline, "tail": f.tail}
