"""The `topowatch` command."""
