"""Slurm's own words, shared by every floor, and the Slurm assets installed as package data.

:mod:`.commands` runs Slurm's tools and reads their output (job states, squeue/sacct lines,
scancel) for both the launcher's Slurm backend and the Slurm workers of the merge and the
analysis, which may not import each other; it imports only the umbrella. Beside it: the sbatch
template and the local-cluster scripts (``slurm-up.sh``, ``slurm-down.sh``).
"""
