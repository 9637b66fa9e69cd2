"""The simulation, the embedded default. Only the CLI entry point, tests and benchmarks use it."""
