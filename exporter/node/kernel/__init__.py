"""The kernel-log pipeline's pure half: which lines are faults (patterns) and the ledger that turns
matches into events (events). The reader is exporter.sources.kmsg; the check is
healthcheck.detection.checks.kernel_log."""
