"""Two replicas, one actor: leader election on a Lease (election) and its flags (args,
parser-only)."""
