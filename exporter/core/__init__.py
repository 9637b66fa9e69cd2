"""The shared bottom: plain types and catalogs every part reads (snapshot, exposition, findings and
their annotation, provenance, the XID catalog). Imports nothing of ours."""
