"""Server-rendered pages of the cluster service (HTML and SVG; no JavaScript build)."""
