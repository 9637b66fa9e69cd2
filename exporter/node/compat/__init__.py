"""Peers' metric names, opt-in: dcgm-exporter's DCGM_FI_* and the EFA node exporter's families."""
