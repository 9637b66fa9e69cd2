"""Slurm at the edge: the squeue/sinfo/scontrol wrapper and the parsers of what they print."""
