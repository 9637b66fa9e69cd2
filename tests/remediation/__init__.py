"""Remediation: policy, controller, lifecycle, providers, the deep-check rung, end to end."""
