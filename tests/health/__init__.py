"""Health detection: checks, the monitor and its damping, the reporter, provenance."""
