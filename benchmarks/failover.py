"""Failover of the cluster service: kill -9 the leader mid-remediation, time the handover.

Two real `topowatch cluster --leader-elect` processes (remediation in act mode, the hyperpod
provider) run against one simulated API server in this process; they find it through a
generated kubeconfig. Each run: a node turns bad and the leader labels it for HyperPod's reboot
(the remediation is under way: HyperPod has the node pending); then the leader gets SIGKILL (no
Lease release) and, at the same moment, another node's agent reports it bad. Measured from the
kill, on this machine's wall clock:

  (a) lease: the standby holds the Lease: the acquireTime it wrote (it stamps it just before
      its write; the kill and the stamp are both this machine's wall clock);
  (d) first decision: the new leader's first remediation decision after the takeover (the
      `at` of its audit record: the pending node, skipped, since HyperPod has it);
  (b) act: the new leader acts on the node that turned bad at the kill (the `at` of its `act`
      decision, just before the label write).

A fresh replica (new identity, as a Deployment would start one) then becomes the next standby.
client-go's rules bound (a) by lease + up to two jittered retry periods (the standby counts the
lease from when it *saw* the last renewal, at its own next retry): with client-go's 2 s retry
"<= lease + 2 s" can be no, so topowatch's default retry is 0.4 s (exporter/cluster/leader/args.py).
The defaults are the command line's. Prints figures; never passes or fails. Everything shares
this machine's cores.

    .venv/bin/python benchmarks/failover.py [--runs 5] [--lease 15] [--renew 10] [--retry 0.4]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import _procs
from benchmarks._procs import exit_on_sigterm
from exporter.cluster.leader.args import LEASE_DURATION_S, RENEW_DEADLINE_S, RETRY_PERIOD_S
from exporter.sim.cluster import ClusterShape
from exporter.sim.environment import SimulatedEnvironment
from tests.cluster.test_failover import PENDING_REBOOT, FailoverRig, LeaseWatch, Replica, wait_for


def decisions(replica: Replica, node: str) -> list[dict[str, object]]:
    return [r for r in replica.recent(node) if r["audit"] == "decision"]


def yes(seconds: float, bound: float) -> str:
    return "yes" if seconds <= bound else "no"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--lease", type=float, default=LEASE_DURATION_S, help="lease, s")
    parser.add_argument(
        "--renew", type=float, default=None, help="default: 10 s, or 2/3 of --lease"
    )
    parser.add_argument("--retry", type=float, default=RETRY_PERIOD_S, help="default: the CLI's")
    args = parser.parse_args()
    renew = args.renew
    if renew is None:
        renew = RENEW_DEADLINE_S if args.lease == LEASE_DURATION_S else args.lease * 2 / 3
    retry = args.retry
    bound = args.lease + 2.0
    exit_on_sigterm()  # SIGTERM, like Ctrl-C, runs the `finally` below
    shape = ClusterShape(
        p5_nodes=2 * args.runs + 2,
        ultraserver_nodes=0,
        teams=("a",),
        arrivals_per_minute=0.0,
        initial_workloads=0,
    )
    env = SimulatedEnvironment(seed=0, shape=shape).start()
    rows: list[tuple[int, float, float, float]] = []
    with tempfile.TemporaryDirectory(prefix="topowatch-failover-") as workdir:
        rig = FailoverRig(env, Path(workdir), args.lease, renew, retry, popen=_procs.start)
        try:
            names = [n.name for n in env.cluster.nodes()]
            replicas = [rig.start("replica-0"), rig.start("replica-1")]
            for replica in replicas:
                rig.wait_ready(replica)
            leader, standby = rig.leader_and_standby(*replicas)
            for run in range(args.runs):
                pending, fresh = names[2 * run], names[2 * run + 1]
                rig.report(pending, sick=True)
                wait_for(
                    lambda n=pending: (
                        rig.label(n) == PENDING_REBOOT
                        and (rig.state(n) or {}).get("outcome") == "done"
                    ),
                    60,
                    f"run {run + 1}: the leader's reboot label",
                )
                watch = LeaseWatch(rig)
                try:
                    killed_at = time.time()
                    leader.kill()
                    rig.report(fresh, sick=True)  # this node's agent reports at the kill
                    wait_for(
                        lambda s=standby: rig.holder() == s.identity,
                        args.lease * 3 + 30,
                        f"run {run + 1}: takeover",
                    )
                finally:
                    watch.stop()
                acquired = watch.first_held_by(standby.identity).acquired
                assert acquired is not None
                acted = wait_for(
                    lambda s=standby, n=fresh: [
                        d for d in decisions(s, n) if d["verdict"] == "act"
                    ],
                    60,
                    f"run {run + 1}: the new leader's action",
                )
                first = wait_for(lambda s=standby, n=pending: decisions(s, n), 30, "first decision")
                act_at = float(str(acted[0]["at"]))
                first_at = min(act_at, float(str(first[0]["at"])))
                rows.append(
                    (
                        run + 1,
                        acquired.timestamp() - killed_at,
                        first_at - killed_at,
                        act_at - killed_at,
                    )
                )
                # A fresh replica takes the dead one's place as the next standby.
                leader, standby = standby, rig.start(f"replica-{run + 2}")
                rig.wait_ready(standby)
        finally:  # also on Ctrl-C: the replicas must not outlive the benchmark
            rig.stop_all()
            rig.api.close()
            env.stop()

    print(
        f"lease {args.lease:g} s, renew deadline {renew:g} s, retry {retry:g} s;"
        f" {len(rows)} runs of kill -9 of the leader mid-remediation; seconds from the kill"
    )
    print(f"{'run':>3}  {'(a) lease':>9}  {'(d) decision':>12}  {'(b) act':>8}  <= lease + 2 s")
    for run, lease_s, first_s, act_s in rows:
        verdict = (
            f"(a) {'yes' if lease_s <= bound else 'no'}, (b) {'yes' if act_s <= bound else 'no'}"
        )
        print(f"{run:>3}  {lease_s:>9.2f}  {first_s:>12.2f}  {act_s:>8.2f}  {verdict}")
    if rows:
        worst_a = max(r[1] for r in rows)
        worst_d = max(r[2] for r in rows)
        worst_b = max(r[3] for r in rows)
        print(
            f"max  {worst_a:>9.2f}  {worst_d:>12.2f}  {worst_b:>8.2f}"
            f"  (a) {yes(worst_a, bound)}, (b) {yes(worst_b, bound)}"
        )


if __name__ == "__main__":
    main()
