"""A simulated Kueue: its objects, a TAS-aware scheduler, conditions, messages and Events."""
