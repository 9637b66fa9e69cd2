"""The node agent: poll the sources into a snapshot, render it, serve the bytes."""
