"""The notebook helpers (``breakdown_table(store)``, ``stragglers_table(store)``, …): one
analysis per version of a store, shared, instead of one per call (issue 10)."""

from __future__ import annotations

from pathlib import Path


def test_table_helpers_share_one_analysis_per_store_version(data_dir: Path, tmp_path: Path) -> None:
    """``breakdown_table(store)`` then ``stragglers_table(store)`` used to analyse twice."""
    import os

    from analysis_frames import merged
    from rankscope.analysis.engine import driver as pipeline

    store = merged(data_dir, "cpu_gloo_4rank_straggler", tmp_path)
    spec = pipeline.ClusterSpec(scheduler=pipeline.SYNCHRONOUS)
    calls: list[Path] = []
    real = pipeline.analyze

    def counting(path: object, s: object = None, **kw: object) -> object:
        calls.append(Path(str(path)))
        return real(path, s, **kw)  # type: ignore[arg-type]

    pipeline.analyze = counting  # type: ignore[assignment]
    try:
        pipeline.breakdown_table(store, spec)
        pipeline.stragglers_table(store, spec)
        a = pipeline.ops_table(store, spec)
        assert len(calls) == 1 and len(a)
        # an Analysis is used as it is
        assert pipeline.analysis_of(pipeline.analysis_of(store, spec)) is pipeline.analysis_of(
            store, spec
        )
        # a store written again is analysed again
        st = store.stat()
        os.utime(store, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
        pipeline.verdict_table(store, spec)
        assert len(calls) == 2
    finally:
        pipeline.analyze = real  # type: ignore[assignment]
