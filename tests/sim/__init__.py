"""The simulation: the simulated API server, cluster, elastic jobs, the demo."""
