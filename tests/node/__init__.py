"""The node agent: poller, rendering, compatibility names, serving, the XID and kernel-log
catalogs."""
