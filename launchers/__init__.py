"""Places ranks on machines and owns what runs inside them: run spec, run directory, launcher backends, per-rank runtime."""
