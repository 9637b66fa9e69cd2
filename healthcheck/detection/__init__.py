"""Health detection: checks turn a snapshot into findings; the monitor damps them; the reporter
publishes them on the node's own Node. Meets remediation only at exporter.core.findings."""
