"""Durable history: the preemption ledger, finished workloads, scale events, the audit."""
