"""Remediation: findings and alerts in, safe actions out (policy, controller, state, audit,
providers). Meets detection only at exporter.core.findings."""
