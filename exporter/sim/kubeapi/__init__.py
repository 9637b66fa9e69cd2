"""A simulated Kubernetes API server: list/watch semantics, store, selectors, patches."""
