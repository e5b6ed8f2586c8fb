"""Slurm assets (sbatch template, local-cluster scripts), installed as package data."""
