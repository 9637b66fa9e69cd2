"""topowatch: the node agent, the cluster service, their sources, topology and simulation."""
