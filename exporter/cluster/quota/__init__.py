"""The quota advisor: sampled history, recommendations, their views and emitters, its command."""
