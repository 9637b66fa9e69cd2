"""Parsers: raw Kubernetes and Kueue objects (either served version) into the model's types."""
