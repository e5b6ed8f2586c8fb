"""Strings as Python objects in pandas during one merge or analysis.

Why: pandas 3 infers its ``str`` dtype for every sequence of strings, and with pyarrow installed
(dask's dataframe needs it) that dtype stores them in Arrow arrays. An analysis makes thousands
of small frames, Series and column labels holding strings (op names, groups, kinds); on those,
each construction, ``take`` and label lookup goes through Arrow's conversion, a fixed cost per
call that small frames never amortise. On ``param_dlrm_8rank`` (8 ranks) Arrow's string code ran
~1,250 conversions and ~460 ``take`` calls, and ``rankscope analyze FOLDER`` took 0.2-0.45 s more
CPU than with object strings (docs/performance.md). The results are identical either way
(``tests/test_pandas_strings.py`` compares the summary and the store of real traces); object
strings are pandas 2's own behaviour, which rankscope supports too.

:func:`object_strings` sets pandas' ``future.infer_string`` off for its body only and restores
the caller's value, so a notebook's own pandas settings are left alone after the call. pandas 4
removes the option (pyproject.toml keeps pandas < 4); were it gone, the body would run as is.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

#: pandas' option that makes a sequence of ``str`` a ``str`` (Arrow-backed) column.
INFER_STRING_OPTION = "future.infer_string"


@contextlib.contextmanager
def object_strings(if_imported: bool = False) -> Iterator[None]:
    """Run the body with pandas inferring object dtype for strings (module docstring); the
    caller's setting is restored on the way out, error or not.

    ``if_imported``: where pandas is not imported yet, run the body as is rather than import it
    (``rankscope merge`` of other tools' traces imports none: ``orchestrator/merge.py``; a body
    that imports it after all gets pandas' default, the same results as above)."""
    import sys

    if if_imported and "pandas" not in sys.modules:
        yield
        return
    import pandas as pd

    with warnings.catch_warnings():
        # pandas 3 warns that the option goes away in pandas 4 (the docstring's fallback)
        warnings.simplefilter("ignore")
        try:
            old = pd.get_option(INFER_STRING_OPTION)
        except pd.errors.OptionError:
            old = None
        if old is not None:
            pd.set_option(INFER_STRING_OPTION, False)
    try:
        yield
    finally:
        if old is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                pd.set_option(INFER_STRING_OPTION, old)
