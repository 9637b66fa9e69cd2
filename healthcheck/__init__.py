"""Health: pure checks on a node snapshot, damping, remediation policy, controller, providers."""
