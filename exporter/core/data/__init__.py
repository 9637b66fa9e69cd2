"""Package data: NVIDIA's XID catalog."""
