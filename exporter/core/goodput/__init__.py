"""The goodput ledger's shared words (issue 29): what both schedulers' ledgers record.

`causes` holds the bounded vocabularies (why a job stopped; which part of a node failed) and the
health-finding/XID -> component mapping; `interruptions` holds the ledger entry, `Interruption`,
and its store/JSON form. Neither knows Kueue or Slurm: the Kueue ledger
(`exporter.cluster.goodput`) and the Slurm ledger (`exporter.slurm.goodput`) both build on them,
so the two report the same causes, components and metric label values.
"""
