"""Elastic training jobs: their scale events, and the idle GPUs they could have used."""
