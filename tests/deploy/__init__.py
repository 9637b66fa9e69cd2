"""What ships beside the code: the Helm chart, its admission policy, alert rules, dashboards,
Prometheus end to end, the HyperPod add-on."""
