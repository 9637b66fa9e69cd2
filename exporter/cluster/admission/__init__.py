"""The `topowatch.io/node-health` admission check controller (issue 30, item 1).

Kueue asks every AdmissionCheck's controller, once a Workload has quota reserved (and, with
TAS, a topology assignment naming its nodes), whether it may start: the controller sets the
Workload's `status.admissionChecks[]` entry to Ready, Retry or Rejected. Ours answers from what
the cluster service already knows about the nodes (the node agents' findings, HyperPod's
health and deep-health-check labels, cordons, repeat offenders), so a job is held off a bad
node before it lands there and dies.

One job per module, pure cores and I/O at the edges:

- `settings`: the `admission:` section of the config, validated;
- `parse`: AdmissionCheck objects, a Workload's check entries, ClusterQueue check strategies
  and the node agents' findings, from raw API objects of either Kueue version; never raises;
- `decide`: the verdict for one Workload (pure; time passed in);
- `audit`: the recent decisions and the metrics;
- `writer`: the status patch through the Kubernetes API (the edge);
- `controller`: what the cluster service runs each cycle, tying them together.
"""
