"""The topology tree, EC2 topology and Slurm topology files."""
