"""Slurm: placement, the slurm-controller, packaging."""
