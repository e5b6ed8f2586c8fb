"""The top floor: the CLI, the run's life (spec → launcher → wait → merge → analyze), trace reading, clock alignment, merge."""
