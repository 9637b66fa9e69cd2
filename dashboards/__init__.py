"""Grafana dashboards as code: `python dashboards/generate.py` writes dashboards/*.json."""
