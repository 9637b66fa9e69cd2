"""The cluster service's /metrics, rendered from the model (elastic jobs' families in their own
module)."""
