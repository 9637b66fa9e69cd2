"""The cluster service's side of durable history: which rows to write (rows), when (feed), how to
read them back (routes), its flags (args)."""
