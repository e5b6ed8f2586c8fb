"""The one compiled part of rankscope: the trace reader's scanner (``_kineto_scan.c``).

Everything else is configured in pyproject.toml. ``optional=True``: on a machine without a C
compiler or Python's headers the install still succeeds and the reader takes its pure-Python
path (same columns, ~half the speed; ``rankscope.orchestrator.ingest.kineto_scan``), and
``tests/test_kineto_scan.py`` fails there, saying the scanner was not built.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "rankscope.orchestrator.ingest._kineto_scan",
            ["orchestrator/ingest/_kineto_scan.c"],
            extra_compile_args=[
                "-O2",
                "-std=c99",
                "-pthread",
                "-Wall",
                "-Wno-missing-field-initializers",
            ],
            extra_link_args=["-pthread"],
            optional=True,
        )
    ]
)
