"""Providers that carry a remediation decision out (HyperPod label, SageMaker API, Slurm,
cordon, webhook). Each takes a batch, so APIs with batch calls can use them, and reports a
result per node; none raises for a per-node failure."""
