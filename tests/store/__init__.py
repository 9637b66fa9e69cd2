"""The durable history store and its writer."""
