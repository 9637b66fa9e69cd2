"""Slurm: reading slurmctld (nodes, jobs) and judging placement against the topology tree."""
