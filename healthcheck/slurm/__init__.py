"""The Slurm remediation controller: node agents polled over HTTP, the shared policy, scontrol."""
