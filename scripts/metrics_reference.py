"""Write docs/metrics.md, the metrics reference, from the code (`.venv/bin/python
scripts/metrics_reference.py`; `--check` exits 1 when the committed page differs).

There is no registry to read: each component builds its `Family` objects where it renders them.
So this runs every component in-process on the simulation, as the test harness does
(`tests/expositions.py`), and records every `Family` built while it does, served or empty:

- the node agent on each simulated profile with every fault of the harness, its kernel log
  monitor, a custom check, `--compat dcgm,efa` and its health API, and on a node whose agent may
  not open the GPUs (a deployment fault);
- the cluster service on the harness's simulated cluster (preemptions, pending work, remediation
  in observe mode, quota advice, EFA remote errors) and on the one with elastic jobs, plus the
  parts a plain run leaves off: EC2 scheduled events, leader election and the history store;
- `topowatch slurm-controller` with its remediation controller, and its placement families on
  the real `squeue --json` documents of each Slurm version the tests hold (tests/fixtures/slurm/).

Each family's name, type and help are the code's; its labels are every label name its samples
carry across those runs (a family with no sample in any run says so); its unit comes from the
name's base-unit suffix. tests/deploy/test_docs.py fails when the page and the code disagree.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: make `exporter` and `tests` importable
    sys.path.insert(0, str(REPO))

from exporter.core.exposition import COUNTER, HISTOGRAM, INFO, UNTYPED, Family  # noqa: E402
from healthcheck.remediation.audit import Auditor  # noqa: E402

OUT = REPO / "docs" / "metrics.md"
COMMAND = ".venv/bin/python scripts/metrics_reference.py"

NODE = "node agent"
CLUSTER = "cluster service"
SLURM = "Slurm controller"
COMPONENTS = (NODE, CLUSTER, SLURM)

# Base units a name ends in (DESIGN.md, "Names"), as Prometheus' naming guide spells them.
UNITS = ("seconds", "bytes", "watts", "joules", "celsius", "ratio", "hertz", "volts", "meters")


@dataclass
class Seen:
    """What the runs showed of one family."""

    name: str
    kind: str
    help: str
    components: set[str] = field(default_factory=set)
    labels: set[str] = field(default_factory=set)
    sampled: bool = False


@contextlib.contextmanager
def recording(into: list[Family]) -> Iterator[None]:
    """Every `Family` this thread builds while inside, appended to `into` (samples are read
    afterwards). Other threads (a test's servers still running) are not recorded."""
    original = Family.__init__
    me = threading.get_ident()

    def init(self: Family, *args: object, **kwargs: object) -> None:
        original(self, *args, **kwargs)  # type: ignore[arg-type]
        if threading.get_ident() == me:
            into.append(self)

    Family.__init__ = init  # type: ignore[method-assign]
    try:
        yield
    finally:
        Family.__init__ = original  # type: ignore[method-assign]


def label_names(text: str) -> list[str]:
    """The label names of a rendered label string `{a="x",b="y \\" z"}` (values may hold any
    escaped character, so this walks the string rather than splitting it)."""
    names: list[str] = []
    i = text.find("{")
    if i < 0:
        return names
    i += 1
    while i < len(text) and text[i] != "}":
        eq = text.index("=", i)
        names.append(text[i:eq].strip(", "))
        i = eq + 2  # past `="`
        while text[i] != '"':
            i += 2 if text[i] == "\\" else 1
        i += 1
        if i < len(text) and text[i] == ",":
            i += 1
    return names


def sample_labels(family: Family) -> Iterator[list[str]]:
    for labels, _ in family.samples:
        yield [n for n in label_names(labels) if n != "le"]
    for line in family.lines:
        head = line.split(" ", 1)[0] if "{" not in line else line[: line.rindex("}") + 1]
        yield label_names(head)


# --- the runs ---------------------------------------------------------------------------------


def node_runs() -> None:
    """The node agent on every harness profile and on a deployment fault."""
    from exporter.node.poller import Poller
    from exporter.node.serving import HealthApi
    from exporter.sim.faults import parse_faults
    from exporter.sim.hardware.node import SimulatedNode
    from exporter.sim.hardware.profiles import get_profile
    from exporter.sources.custom_checks import CheckSpec, CustomCheckRunner
    from healthcheck.detection.config import config_from_mapping
    from healthcheck.detection.monitor import HealthMonitor
    from tests.expositions import FAULTS, NODE_POLLS, PROFILES, START

    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "gpu-burn.sh"
        script.write_text("#!/bin/sh\necho 'GPU 3 failed the burn test'\nexit 1\n")
        script.chmod(0o755)
        config = config_from_mapping(
            {"custom_checks": [{"name": "gpu-burn", "path": str(script), "action": "reboot"}]}
        )
        runs: list[tuple[str, tuple[str, ...]]] = [(p, FAULTS[p]) for p in PROFILES]
        runs.append(("p5.48xlarge", ("nvml-no-permission",)))
        for profile, faults in runs:
            sim = SimulatedNode(get_profile(profile), parse_faults(faults), start=START)
            sources = sim.sources()
            if "nvml-no-permission" not in faults:
                sources.kernel_log = sim.kernel_log_source()
            checks = CustomCheckRunner([CheckSpec(name="gpu-burn", path=str(script))])
            checks.run_all_once()
            sources.custom_checks = checks
            now = [START]
            monitor = HealthMonitor(config)
            # what the node reporter counts as it writes the Node (it needs an API server)
            monitor.count_report("written", "condition")
            monitor.count_report("failed", "api_error")
            poller = Poller(
                "hyperpod-i-0123456789abcdef0",
                sources,
                compat=frozenset({"dcgm", "efa"}),
                clock=lambda now=now: now[0],  # type: ignore[misc]
                health=monitor,
            )
            try:
                for _ in range(NODE_POLLS):
                    now[0] += 5.0
                    poller.poll()
            finally:
                checks.close()
                sources.close()
                sim.close()
        HealthApi("hyperpod-i-0123456789abcdef0", None).families()


def audit_each_kind(audit: Auditor) -> None:
    """One audit record of each kind that a run without real nodes has none of."""
    record = audit.problem("node-a", "findings_not_from_agent", "", 0.0)
    audit.outcome("node-a", "reboot", True, "", 0.0)
    audit.alert("node-a", "unknown_node", "", 0.0)
    audit.lifecycle("node-a", "recovered", "", 0.0)
    audit.event_failed(record, TimeoutError())


def cluster_runs() -> None:
    """The harness's two simulated clusters, then a service with EC2 events, a leader, a
    history store and the admission check (one decision, one refused write)."""
    from exporter.cluster.admission.controller import AdmissionController
    from exporter.cluster.admission.decide import Decision
    from exporter.cluster.admission.settings import AdmissionSettings
    from exporter.cluster.history.feed import open_history
    from exporter.cluster.informers import InformerStatus
    from exporter.cluster.service import ClusterService
    from exporter.sources.lease import leader_families
    from healthcheck.remediation.controller import RemediationController
    from healthcheck.remediation.policy import PolicyConfig
    from tests.expositions import elastic_cluster_exposition, simulated_world

    simulated_world().service.metrics_body(openmetrics=False)
    elastic_cluster_exposition()

    class Leader:
        def families(self) -> list[Family]:
            return leader_families("topowatch-cluster-0", True, 1)

    class Informers:  # what a running InformerSet reports (it needs an API server)
        def status(self) -> list[InformerStatus]:
            return [InformerStatus("Workload", "42", True, "", 1, 0, 1, 7, {"timeout": 1})]

    controller = RemediationController(PolicyConfig(), [])
    audit_each_kind(controller.auditor)
    admission = AdmissionController(AdmissionSettings(enabled=True))
    check = "topowatch-node-health"
    decision = Decision("ns", "wl", "uid", check, "Ready", "healthy", "", 0.0, "Pending")
    admission.audit.record(decision, "observe", "observe", 0.001)
    admission.audit.write_error("conflict")
    with tempfile.TemporaryDirectory() as tmp:
        history = open_history(f"sqlite:///{tmp}/history.db", "topowatch-cluster-0")
        try:
            service = ClusterService(
                controller=controller,
                leadership=Leader(),  # type: ignore[arg-type]
                history=history,
                admission=admission,
            )
            service.informers = Informers()  # type: ignore[assignment]
            service.ec2_event_counts = {}
            # a deep health check label no one documents: an object problem
            labels = {"sagemaker.amazonaws.com/deep-health-check-status": "Unheard-of"}
            node = {"kind": "Node", "metadata": {"name": "node-a", "labels": labels}}
            service.replace("Node", [node])
            service.metrics_body(openmetrics=False)
        finally:
            history.store.close()


def slurm_runs() -> None:
    """The controller as `build_service` wires it (no cycle: no slurmctld here), and the
    placement families of the squeue documents the tests hold (tests/fixtures/slurm/)."""
    from exporter.slurm.metrics import slurm_families
    from exporter.slurm.service import build_service
    from exporter.slurm.settings import settings_from_mapping
    from exporter.sources.slurm.jobs import parse_jobs
    from exporter.sources.slurm.nodes import parse_nodes
    from exporter.topology.files import load_placements

    fixtures = REPO / "tests" / "fixtures" / "slurm"
    with tempfile.TemporaryDirectory() as tmp:
        token = Path(tmp) / "token"
        token.write_text("x" * 32 + "\n")
        settings = settings_from_mapping(
            {
                "cluster": "ml-cluster",
                "agents": {"token_file": str(token)},
                "remediation": {"state_file": f"{tmp}/state.json"},
                "prometheus": {"file_sd": f"{tmp}/targets.json"},
            }
        )
        service = build_service(settings)
        nodes, _ = parse_nodes((fixtures / "sinfo_v0.0.38.json").read_text())
        # what a cycle against slurmctld would leave (there is none here)
        service.nodes = {node.name: node for node in nodes}
        service.last_outcome = {node.name: "ok" for node in nodes}
        service.counts.command_failures[("squeue", "timeout")] += 1
        audit_each_kind(service.controller.auditor)
        service.families()
        topology = Path(tmp) / "topology.conf"
        topology.write_text(
            "SwitchName=sw-top Switches=sw-a,sw-b\n"
            "SwitchName=sw-a Nodes=gpu-[1-2]\nSwitchName=sw-b Nodes=gpu-[3-4]\n"
        )
        placements = load_placements(topology)
    for squeue in sorted(fixtures.glob("squeue_v*.json")):  # one document per Slurm version
        jobs, problems = parse_jobs(squeue.read_text())
        slurm_families(jobs, nodes, placements, "ml-cluster", problems)


RUNS: tuple[tuple[str, Callable[[], None]], ...] = (
    (NODE, node_runs),
    (CLUSTER, cluster_runs),
    (SLURM, slurm_runs),
)


def observe() -> dict[str, dict[str, Seen]]:
    """Family name -> component -> what that component's runs showed of it (the Kueue and the
    Slurm side share placement names, each with its own help and labels)."""
    seen: dict[str, dict[str, Seen]] = {}
    for component, run in RUNS:
        families: list[Family] = []
        quiet = logging.root.manager.disable
        logging.disable(logging.CRITICAL)  # the runs log what they find; the page is the output
        try:
            with recording(families):
                run()
        finally:
            logging.disable(quiet)
        for family in families:
            item = seen.setdefault(family.name, {}).get(component)
            if item is None:
                item = Seen(family.name, family.kind, family.help)
                seen[family.name][component] = item
            if (item.kind, item.help) != (family.kind, family.help):
                raise ValueError(
                    f"{family.name} is built twice by the {component} with different type or"
                    f" help: {item.kind!r} {item.help!r} / {family.kind!r} {family.help!r}"
                )
            item.components.add(component)
            for names in sample_labels(family):
                item.sampled = True
                item.labels.update(names)
    for name, by_component in seen.items():
        kinds = {item.kind for item in by_component.values()}
        if len(kinds) > 1:
            raise ValueError(f"{name} has different types in different components: {kinds}")
    return seen


def merged(by_component: dict[str, Seen]) -> list[Seen]:
    """One row per distinct (help, labels): components that agree share it."""
    rows: list[Seen] = []
    for item in (by_component[c] for c in COMPONENTS if c in by_component):
        for row in rows:
            if (row.help, row.labels, row.sampled) == (item.help, item.labels, item.sampled):
                row.components.update(item.components)
                break
        else:
            rows.append(
                Seen(
                    item.name,
                    item.kind,
                    item.help,
                    set(item.components),
                    set(item.labels),
                    item.sampled,
                )
            )
    return rows


# --- the page ---------------------------------------------------------------------------------


def sample_name(seen: Seen) -> str:
    if seen.kind == COUNTER:
        return seen.name + "_total"
    if seen.kind == INFO:
        return seen.name + "_info"
    return seen.name


def unit(name: str) -> str:
    return next((suffix for suffix in UNITS if name.endswith("_" + suffix)), "")


def kind_shown(kind: str) -> str:
    return {INFO: "info (gauge)", UNTYPED: "untyped", HISTOGRAM: "histogram"}.get(kind, kind)


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _ours(seen: Seen) -> bool:
    return seen.name.startswith("topowatch_")


SECTIONS: tuple[tuple[str, Callable[[Seen], bool]], ...] = (
    ("Node agent: topowatch's own families", lambda s: NODE in s.components and _ours(s)),
    ("Node agent: compatibility families (`--compat dcgm,efa`)", lambda s: not _ours(s)),
    ("Cluster service", lambda s: CLUSTER in s.components),
    ("Slurm controller", lambda s: SLURM in s.components),
)


def render(seen: dict[str, dict[str, Seen]]) -> str:
    out = [
        "# Metrics reference",
        "",
        "<!-- Generated by scripts/metrics_reference.py from the code; do not edit. -->",
        "",
        "Every metric family topowatch serves, as the code builds it: the name as scraped"
        " (counters with `_total`, info families with `_info`), its type, its unit (the"
        " base-unit suffix of its name), its labels, its help text and which component serves"
        " it. Generated by running each component on the simulation with every fault the tests"
        " inject (see `scripts/metrics_reference.py`); regenerate with"
        f" `{COMMAND}` after adding or changing a family (`tests/deploy/test_docs.py` fails"
        " until you do).",
        "",
        "Components: **node agent** (`topowatch node`, port 9402), **cluster service**"
        " (`topowatch cluster`, port 9403), **Slurm controller** (`topowatch slurm-controller`,"
        " port 9404). Every node-agent series carries `node`; a HyperPod scrape may add"
        " `cluster_id`, `cluster_name` and `instance` ([Replacing dcgm-exporter and the EFA"
        " exporter](hyperpod-exporters.md)). A family the runs built but left empty shows"
        " *(none sampled)* for its labels. A family both schedulers serve (the placement"
        " families) has a row per component where their help or labels differ.",
        "",
        f"{len(seen)} families.",
        "",
    ]
    rows = [row for _, by_component in sorted(seen.items()) for row in merged(by_component)]
    placed: set[int] = set()
    for title, wanted in SECTIONS:
        chosen = [row for row in rows if id(row) not in placed and wanted(row)]
        if not chosen:
            continue
        placed.update(id(row) for row in chosen)
        out += [f"## {title}", "", "| Metric | Type | Unit | Labels | Served by | Help |"]
        out.append("| --- | --- | --- | --- | --- | --- |")
        for s in chosen:
            if s.sampled:
                labels = ", ".join(f"`{n}`" for n in sorted(s.labels)) or "(none)"
            else:
                labels = "*(none sampled)*"
            served = ", ".join(c for c in COMPONENTS if c in s.components)
            out.append(
                f"| `{sample_name(s)}` | {kind_shown(s.kind)} | {unit(s.name)} |"
                f" {labels} | {served} | {cell(s.help)} |"
            )
        out.append("")
    left = sorted({row.name for row in rows if id(row) not in placed})
    if left:
        raise ValueError(f"families in no section: {', '.join(left)}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/metrics.md differs")
    args = parser.parse_args(argv)
    text = render(observe())
    if args.check:
        current = OUT.read_text(encoding="utf-8") if OUT.exists() else ""
        if current != text:
            print(f"docs/metrics.md is stale: run {COMMAND}", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
