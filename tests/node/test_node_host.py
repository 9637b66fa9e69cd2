"""The node agent on a Slurm host: placements from a topology file, /api/v1/health, the install.

A Slurm host has no Node object: its topology labels come from `--topology-file` (the JSON of
`topowatch topology from-ec2 --format json` or a topology.conf), and its findings are read by
the head node's controller over HTTP instead of from the Node annotation, so the list served
must be the annotation's, byte for byte after decoding.
"""

from __future__ import annotations

import argparse
import configparser
import http.client
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from exporter.cli import build_parser
from exporter.cli.node import NodeConfigError, apply_node_config, run_node
from exporter.core.exposition import EMPTY, Exposition, encode_text
from exporter.core.findings import Finding, decode_findings, findings_to_json
from exporter.node.agent import appended
from exporter.node.health_api import (
    BAD_CREDENTIALS,
    BAD_REQUEST,
    MAX_WAIT_S,
    MAX_WAITERS,
    NO_CREDENTIALS,
    NOT_READY,
    OK,
    Evaluation,
    Wait,
    authorize,
    body,
    parse_wait,
    respond,
    version_of,
)
from exporter.node.serving import HANDLER_TIMEOUT_S, HealthApi, MetricsServer, TokenFile
from exporter.topology.ec2 import (
    Topology,
    instances_from_pages,
    load_name_map,
    load_pages,
    named_topology,
)
from exporter.topology.files import (
    TopologyFileError,
    load_placements,
    parse_placements,
    placement_labels,
    under_node_labels,
)
from exporter.topology.labels import LAYER_KEYS, ZONE_KEY, Placement
from exporter.topology.writers import slurm_tree, topology_json
from healthcheck.detection.monitor import HealthReport
from healthcheck.detection.reporter import published
from tests.conftest import promtool_lint, systemd_verify

REPO = Path(__file__).resolve().parents[2]
EC2 = REPO / "tests" / "fixtures" / "ec2"
INSTALL = REPO / "packaging" / "slurm" / "install-node.sh"
UNIT = REPO / "packaging" / "slurm" / "topowatch-node.service"
TOKEN = "tok-3f9a1c7e5b2d4a68"
NOW = 1_764_000_000.0


def fixture_topology(pages: str, names: str | None) -> Topology:
    instances = instances_from_pages(load_pages(EC2 / pages))
    return named_topology(instances, load_name_map(EC2 / names) if names else {})


# --- placements from a file -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pages", "names"),
    [
        ("depth4-mixed-pages.json", "depth4-mixed-names.json"),
        ("gb200-ultraservers.json", "gb200-names.txt"),
    ],
)
def test_the_two_files_of_one_cluster_place_every_node_alike(
    tmp_path: Path, pages: str, names: str
) -> None:
    topology = fixture_topology(pages, names)
    (tmp_path / "topology.json").write_text(topology_json(topology).text)
    (tmp_path / "topology.conf").write_text(slurm_tree(topology).text)
    from_json = load_placements(tmp_path / "topology.json")
    from_conf = load_placements(tmp_path / "topology.conf")
    placed = {topology.name_of(i): i for i in topology.placed}
    assert set(from_conf) == set(placed)  # the conf leaves unplaced instances out
    assert set(from_json) == {topology.name_of(i) for i in topology.instances}
    for name, instance in placed.items():
        assert from_conf[name].layers == from_json[name].layers == instance.network_nodes
        assert from_conf[name].hostname == from_json[name].hostname == name
        assert from_json[name] == instance.placement(hostname=name)


def test_json_carries_zone_ultraserver_and_type_which_a_topology_conf_cannot() -> None:
    topology = fixture_topology("gb200-ultraservers.json", "gb200-names.txt")
    placement = parse_placements(topology_json(topology).text)["gb200-01"]
    assert placement.ultraserver and placement.zone and placement.instance_type
    assert len(placement.layers) == 4
    conf = parse_placements(slurm_tree(topology).text)["gb200-01"]
    assert (conf.ultraserver, conf.zone, conf.instance_type) == ("", "", "")


def test_a_topology_conf_layers_go_from_the_top_switch_down_to_the_leaf() -> None:
    text = (
        "# hand written\n"
        "SwitchName=top Switches=mid[1-2]\n"
        "switchname=mid1 Switches=leaf1\n"
        "SwitchName=mid2 Nodes=big-node  # a node on an inner switch\n"
        "SwitchName=leaf1 Nodes=gpu-[01-02]\n"
    )
    placements = parse_placements(text)
    assert placements["gpu-02"].layers == ("top", "mid1", "leaf1")
    assert placements["big-node"].layers == ("top", "mid2")
    assert placement_labels(placements["gpu-01"]) == {
        LAYER_KEYS[0]: "top",
        LAYER_KEYS[1]: "mid1",
        LAYER_KEYS[2]: "leaf1",
        "kubernetes.io/hostname": "gpu-01",
    }


def test_placement_labels_are_what_from_labels_reads_back() -> None:
    topology = fixture_topology("gb200-ultraservers.json", "gb200-names.txt")
    for placement in parse_placements(topology_json(topology).text).values():
        assert Placement.from_labels(placement_labels(placement)) == placement


def test_node_labels_win_over_the_file_and_are_never_mixed_with_its_layers() -> None:
    from_file = {LAYER_KEYS[0]: "file-1", LAYER_KEYS[1]: "file-2", ZONE_KEY: "file-zone"}
    assert under_node_labels({}, from_file) == from_file
    assert under_node_labels({ZONE_KEY: "node-zone"}, from_file) == {
        **from_file,
        ZONE_KEY: "node-zone",
    }
    assert under_node_labels({LAYER_KEYS[0]: "node-1"}, from_file) == {LAYER_KEYS[0]: "node-1"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"instances": [\n  {"name": "a",}\n]}', "line 2: not JSON"),
        ('{"nodes": []}', "needs an 'instances' list"),
        ('{"instances": [{"name": "a", "network_nodes": "nn-1"}]}', "instances[0].network_nodes"),
        ('{"instances": [{"name": "a", "ultraserver": 7}]}', "instances[0].ultraserver"),
        ('{"instances": [{"name": "a"}, {"name": "a"}]}', "instances[1]: node name 'a'"),
        ('{"instances": [{"network_nodes": []}]}', "neither 'name' nor 'instance_id'"),
        (
            '{"instances": [{"name": "a", "network_nodes": ["1", "2", "3", "4", "5"]}]}',
            "5 network layers; EC2 has at most 4",
        ),
        ("", "no SwitchName lines"),
        ("SwitchName=s1 Nodes=a\nSwitchName=s2 Nodes\n", "line 2: expected KEY=VALUE"),
        ("BlockName=b1 Nodes=a[1-4]\nBlockSizes=4\n", "line 1: a topology/block line"),
        ("SwitchName=s1 Switches=s9\n", "line 1: switch s1 names s9, undefined"),
        (
            "SwitchName=a Switches=c\nSwitchName=b Switches=c\nSwitchName=c Nodes=n1\n",
            "line 2: switch c is under both a and b",
        ),
        ("SwitchName=a Switches=b\nSwitchName=b Switches=a Nodes=n1\n", "is in a loop"),
        (
            "SwitchName=t Switches=a,b\nSwitchName=a Nodes=n1\nSwitchName=b Nodes=n[1-2]\n",
            "line 3: node n1 is listed under both a and b",
        ),
        (
            "SwitchName=l1 Switches=l2\nSwitchName=l2 Switches=l3\nSwitchName=l3 Switches=l4\n"
            "SwitchName=l4 Switches=l5\nSwitchName=l5 Nodes=n1\n",
            "line 5: switch l5: 5 network layers",
        ),
    ],
)
def test_a_bad_topology_file_is_a_clear_error_naming_file_and_place(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "topology"
    path.write_text(text)
    with pytest.raises(TopologyFileError) as caught:
        load_placements(path)
    assert str(caught.value).startswith(f"{path}: ")
    assert message in str(caught.value)


def test_an_unreadable_topology_file_names_itself(tmp_path: Path) -> None:
    with pytest.raises(TopologyFileError, match=r"cannot read topology file .*absent"):
        load_placements(tmp_path / "absent")


# --- the agent's options -----------------------------------------------------------------------


def node_args(*extra: str) -> argparse.Namespace:
    return build_parser().parse_args(["node", *extra])


def once_without_hardware(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes], *extra: str
) -> tuple[int, bytes, bytes]:
    """One `--once` of the real agent (no GPU here, no Kubernetes, an empty sysfs), in-process:
    its exit status, stdout and stderr."""
    root = str(tmp_path)
    args = node_args("--once", "--no-kubernetes", "--sysfs-root", root, "--proc-root", root, *extra)
    args.kernel_log = "off"
    rc = run_node(args)
    out, err = capsysbinary.readouterr()
    return rc, out, err


def topology_info(exposition: bytes) -> dict[str, str]:
    line = next(x for x in exposition.decode().splitlines() if "topology_info{" in x)
    return dict(re.findall(r'(\w+)="([^"]*)"', line))


def test_the_agent_without_kubernetes_labels_its_topology_from_the_file(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    topology = fixture_topology("depth4-mixed-pages.json", "depth4-mixed-names.json")
    conf = tmp_path / "topology.conf"
    conf.write_text(slurm_tree(topology).text)
    rc, out, _ = once_without_hardware(
        tmp_path, capsysbinary, "--topology-file", str(conf), "--node-name", "ip-10-1-3-4"
    )
    assert rc == 0
    instance = next(i for i in topology.instances if topology.name_of(i) == "ip-10-1-3-4")
    info = topology_info(out)
    assert [info[f"layer{n}"] for n in (1, 2, 3, 4)] == list(instance.network_nodes)
    assert info["node"] == "ip-10-1-3-4"
    assert promtool_lint(out) == ""


def test_the_file_is_looked_up_by_the_short_hostname_and_gives_zone_and_type(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    topology = fixture_topology("gb200-ultraservers.json", "gb200-names.txt")
    path = tmp_path / "topology.json"
    path.write_text(topology_json(topology).text)
    rc, out, _ = once_without_hardware(
        tmp_path, capsysbinary, "--topology-file", str(path), "--node-name", "gb200-03.ec2.local"
    )
    assert rc == 0
    info = topology_info(out)
    assert info["layer4"] and info["ultraserver"] and info["zone"] and info["instance_type"]


def test_a_node_missing_from_the_file_warns_and_runs_with_empty_labels(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    conf = tmp_path / "topology.conf"
    conf.write_text("SwitchName=s1 Nodes=other-[1-4]\n")
    rc, out, _ = once_without_hardware(
        tmp_path, capsysbinary, "--topology-file", str(conf), "--node-name", "lonely"
    )
    assert rc == 0
    assert set(topology_info(out).values()) == {"lonely", ""}
    assert "does not list node lonely" in caplog.text


def test_a_bad_topology_file_stops_the_agent_at_start_with_the_reason(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    conf = tmp_path / "topology.conf"
    conf.write_text("SwitchName=s1 Switches=nowhere\n")
    rc, _, err = once_without_hardware(tmp_path, capsysbinary, "--topology-file", str(conf))
    assert rc == 2 and b"line 1: switch s1 names nowhere" in err


def test_a_config_file_fills_what_the_command_line_left_at_its_default(tmp_path: Path) -> None:
    config = tmp_path / "node.yaml"
    config.write_text(
        "no-kubernetes: true\n"
        "kernel-log: off\n"  # YAML 1.1 reads a bare off as false
        "interval: 10\n"
        "listen: 127.0.0.1:9500\n"
        "journal_dir: [/j1, /j2]\n"
        "report-node-status: false\n"
        "health-token-file: /etc/topowatch/health-token\n"
        "node-name: from-config\n"
    )
    args = node_args("--config", str(config), "--interval", "2", "--node-name", "from-cli")
    apply_node_config(args)
    assert args.no_kubernetes is True and args.kernel_log == "off"
    assert args.interval == 2.0 and args.node_name == "from-cli"  # the command line wins
    assert args.listen == ("127.0.0.1", 9500)
    assert args.journal_dir == [Path("/j1"), Path("/j2")]
    assert args.report_node_status is False
    assert args.health_token_file == Path("/etc/topowatch/health-token")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("intervall: 5\n", "unknown setting 'intervall'"),
        ("interval: soon\n", "invalid float value"),
        ("kernel-log: dmesg\n", "invalid choice"),
        ("config: other.yaml\n", "cannot name another"),
        ("- no-kubernetes\n", "expected a mapping"),
        ("listen: [\n", "cannot read --config"),
    ],
)
def test_a_bad_config_file_is_a_clear_error(tmp_path: Path, text: str, message: str) -> None:
    config = tmp_path / "node.yaml"
    config.write_text(text)
    with pytest.raises(NodeConfigError, match=re.escape(message)):
        apply_node_config(node_args("--config", str(config)))


def test_the_health_api_needs_the_health_checks_and_a_readable_token(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    token = tmp_path / "token"
    token.write_text("\n")
    rc, _, err = once_without_hardware(tmp_path, capsysbinary, "--health-token-file", str(token))
    assert rc == 2 and b"is empty" in err
    token.write_text(TOKEN)
    rc, _, err = once_without_hardware(
        tmp_path, capsysbinary, "--health-token-file", str(token), "--no-health"
    )
    assert rc == 2 and b"needs the health checks" in err


# --- /api/v1/health, pure ----------------------------------------------------------------------


def finding(check: str, component: str, severity: str, action: str, actionable: bool) -> Finding:
    evidence = f"{check} on {component}"
    return Finding(check, component, severity, action, evidence, NOW - 60, NOW, actionable)


def sick_report() -> HealthReport:
    """A fatal XID (actionable), a shared EFA warning (published, not actionable) and a damped
    warning (neither): what the annotation carries is the first two."""
    return HealthReport(
        node="ip-10-1-2-3",
        taken_at=NOW,
        findings=(
            finding("xid", "gpu3", "fatal", "replace", True),
            finding("efa_remote_errors", "rdmap16s27:1", "warning", "none", False),
            finding("thermal", "gpu5", "warning", "none", False),
        ),
    )


def test_the_body_carries_exactly_what_the_annotation_would() -> None:
    report = sick_report()
    evaluation = Evaluation(published(report), report.taken_at)
    outcome, response = respond("ip-10-1-2-3", TOKEN, f"Bearer {TOKEN}", evaluation, NOW + 30)
    assert (outcome, response.status) == (OK, 200)
    body = json.loads(response.body)
    assert set(body) == {"node", "generated_at", "ready", "version", "findings"}
    assert body["node"] == "ip-10-1-2-3" and body["ready"] is True
    assert body["generated_at"] == "2025-11-24T16:00:00Z"  # when the checks ran, not now
    assert body["findings"] == json.loads(findings_to_json(published(report)))
    assert [f["check"] for f in body["findings"]] == ["xid", "efa_remote_errors"]
    decoded, problems = decode_findings(json.dumps(body["findings"]))
    assert problems == [] and [f.key for f in decoded] == [f.key for f in published(report)]


def test_before_the_first_evaluation_it_is_503_not_ready() -> None:
    outcome, response = respond("n1", TOKEN, f"Bearer {TOKEN}", None, NOW)
    assert (outcome, response.status) == (NOT_READY, 503)
    assert json.loads(response.body) == {
        "node": "n1",
        "generated_at": "2025-11-24T16:00:00Z",
        "ready": False,
        "version": "",
        "findings": [],
    }


@pytest.mark.parametrize(
    ("header", "outcome"),
    [
        (None, NO_CREDENTIALS),
        ("", NO_CREDENTIALS),
        ("Bearer", BAD_CREDENTIALS),
        ("Bearer wrong", BAD_CREDENTIALS),
        (f"Bearer {TOKEN}x", BAD_CREDENTIALS),
        (f"Basic {TOKEN}", BAD_CREDENTIALS),
        ("Bearer t\u00f6ken", BAD_CREDENTIALS),
        (f"bearer {TOKEN}", OK),
        (f"Bearer  {TOKEN} ", OK),
    ],
)
def test_authorization(header: str | None, outcome: str) -> None:
    assert authorize(header, TOKEN) == outcome
    if outcome != OK:
        _, response = respond("n1", TOKEN, header, None, NOW)
        assert response.status == 401
        assert dict(response.headers)["WWW-Authenticate"].startswith("Bearer ")


def test_an_empty_token_authorizes_nothing_and_no_token_is_404() -> None:
    assert authorize("Bearer ", "") == BAD_CREDENTIALS
    assert authorize("Bearer x", "") == BAD_CREDENTIALS
    _, response = respond("n1", None, f"Bearer {TOKEN}", None, NOW)
    assert response.status == 404
    assert json.loads(response.body) == {"error": "health API disabled: no --health-token-file"}


def test_the_version_names_the_findings_alone() -> None:
    findings = published(sick_report())
    first = Evaluation(findings, NOW)
    version = version_of(first)
    assert re.fullmatch(r"[0-9a-f]{16}", version)
    assert body("n1", first, NOW)["version"] == version
    # The same findings found again, by a later poll: same version, though generated_at moved.
    again = body("n1", Evaluation(findings, NOW + 30), NOW + 30)
    assert (
        again["version"] == version
        and again["generated_at"] != body("n1", first, NOW)["generated_at"]
    )
    assert version_of(Evaluation(findings[:1], NOW)) != version
    assert version_of(Evaluation((), NOW)) not in ("", version)  # healthy, yet ready
    assert version_of(None) == body("n1", None, NOW)["version"] == ""


@pytest.mark.parametrize(
    ("query", "wait"),
    [
        ("", Wait(0.0, None)),
        ("x=1", Wait(0.0, None)),
        ("wait=20&version=9c1f0e4b7a2d3e58", Wait(20.0, "9c1f0e4b7a2d3e58")),
        ("version=&wait=2.5", Wait(2.5, "")),
        ("wait=0&version=v", Wait(0.0, "v")),
        ("wait=3600&version=v", Wait(MAX_WAIT_S, "v")),
        ("wait=5", Wait(5.0, None)),
    ],
)
def test_parse_wait(query: str, wait: Wait) -> None:
    assert parse_wait(query) == wait


@pytest.mark.parametrize(
    "query",
    [
        "wait=",
        "wait=soon",
        "wait=-1",
        "wait=nan",
        "wait=inf",
        "wait=1&wait=2",
        "version=a&version=b",
    ],
)
def test_a_bad_wait_is_400_but_only_for_an_authorized_request(query: str) -> None:
    assert isinstance(parse_wait(query), str)
    outcome, response = respond("n1", TOKEN, f"Bearer {TOKEN}", None, NOW, query)
    assert (outcome, response.status) == (BAD_REQUEST, 400)
    assert "error" in json.loads(response.body)
    outcome, response = respond("n1", TOKEN, None, None, NOW, query)
    assert (outcome, response.status) == (NO_CREDENTIALS, 401)


def test_no_wait_can_outlast_the_handlers_socket_timeout() -> None:
    assert HANDLER_TIMEOUT_S > MAX_WAIT_S
    assert MAX_WAITERS == 16


def test_appended_expositions_keep_one_openmetrics_eof() -> None:
    api = HealthApi("n1", None)
    api.respond(None)
    joined = appended(EMPTY, Exposition.build(api.families()))
    assert joined.openmetrics.count(b"# EOF\n") == 1 and joined.openmetrics.endswith(b"# EOF\n")
    assert joined.text == encode_text(api.families())
    assert b'topowatch_node_health_api_requests_total{node="n1",outcome="disabled"} 1' in (
        joined.text
    )


# --- /api/v1/health, served ----------------------------------------------------------------------


class Published:
    current = EMPTY
    not_ready_reason = None
    healthy = True


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[MetricsServer, HealthApi, Path]]:
    token = tmp_path / "health-token"
    token.write_text(TOKEN + "\n")
    api = HealthApi("ip-10-1-2-3", TokenFile(token), clock=lambda: NOW)
    srv = MetricsServer(Published(), "127.0.0.1", 0, api)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield srv, api, token
    srv.shutdown()
    srv.server_close()
    thread.join()


def get(
    port: int, token: str | None = None, query: str = "x=1"
) -> tuple[int, dict[str, str], dict[str, object]]:
    """One request, on a new connection; its 10 s timeout fails any answer held too long."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    conn.request("GET", f"/api/v1/health?{query}", headers=headers)
    answer = conn.getresponse()
    body = json.loads(answer.read())
    conn.close()
    return answer.status, dict(answer.getheaders()), body


def test_served_health_answers_and_counts_by_outcome(
    server: tuple[MetricsServer, HealthApi, Path], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    srv, api, token = server
    status, headers, _ = get(srv.port)
    assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")
    assert get(srv.port, "not-it")[0] == 401
    status, _, body = get(srv.port, TOKEN)
    assert status == 503 and body["ready"] is False
    report = sick_report()
    api.record(Evaluation(published(report), report.taken_at))
    status, headers, body = get(srv.port, TOKEN)
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert body["findings"] == json.loads(findings_to_json(published(report)))
    # A rotated token takes effect without a restart; the old one stops working.
    rotated = "tok-rotated-0d2c"
    token.write_text(rotated + "\n")
    os.utime(token, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert get(srv.port, TOKEN)[0] == 401
    assert get(srv.port, rotated)[0] == 200
    # A rotation caught half-way (the file gone) keeps the last token.
    token.unlink()
    assert get(srv.port, rotated)[0] == 200
    counts = encode_text(api.families()).decode()
    for outcome, n in [("ok", 3), ("not_ready", 1), ("no_credentials", 1), ("bad_credentials", 2)]:
        assert f'outcome="{outcome}"}} {n}\n' in counts
    assert TOKEN not in caplog.text and rotated not in caplog.text
    assert "token re-read" in caplog.text and "keeping the last token" in caplog.text


class Held(threading.Thread):
    """One long-poll in the background: its answer and how long it took."""

    def __init__(self, port: int, query: str) -> None:
        super().__init__(daemon=True)
        self.port, self.query = port, query
        self.answer: tuple[int, dict[str, str], dict[str, object]] | None = None
        self.elapsed = -1.0

    def run(self) -> None:
        started = time.monotonic()
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=40)
        conn.request("GET", f"/api/v1/health?{self.query}", headers=AUTHORIZED)
        answer = conn.getresponse()
        self.answer = (answer.status, dict(answer.getheaders()), json.loads(answer.read()))
        conn.close()
        self.elapsed = time.monotonic() - started


AUTHORIZED = {"Authorization": f"Bearer {TOKEN}"}


def until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in 10 s"
        time.sleep(0.01)


def test_a_long_poll_returns_when_the_findings_change_not_when_polled_again(
    server: tuple[MetricsServer, HealthApi, Path],
) -> None:
    srv, api, _ = server
    findings = published(sick_report())
    api.record(Evaluation(findings, NOW))
    status, _, first = get(srv.port, TOKEN)
    version = str(first["version"])
    assert status == 200 and version
    held = Held(srv.port, f"wait=20&version={version}")
    held.start()
    until(lambda: api.waiting == 1)
    # The next poll finds the same: a new generated_at, the same version, nobody woken.
    api.record(Evaluation(findings, NOW + 30))
    assert get(srv.port, TOKEN)[2]["version"] == version
    held.join(0.3)
    assert held.is_alive() and api.waiting == 1
    # A finding clears: the held request answers at once with the new version.
    api.record(Evaluation(findings[:1], NOW + 60))
    held.join(15)
    assert not held.is_alive() and held.answer is not None
    assert held.elapsed < 15  # well before the 20 s asked
    status, _, changed = held.answer
    assert status == 200 and changed["version"] not in ("", version)
    assert changed["version"] == version_of(Evaluation(findings[:1], NOW))
    assert len(changed["findings"]) == 1  # type: ignore[arg-type]
    assert api.waiting == 0


def test_a_long_poll_that_sees_no_change_answers_the_same_when_its_wait_ends(
    server: tuple[MetricsServer, HealthApi, Path],
) -> None:
    srv, api, _ = server
    api.record(Evaluation((), NOW))
    version = version_of(Evaluation((), NOW))
    status, _, answer = get(srv.port, TOKEN, f"wait=0.2&version={version}")
    assert status == 200 and answer["version"] == version


def test_another_version_or_no_version_answers_at_once(
    server: tuple[MetricsServer, HealthApi, Path],
) -> None:
    srv, api, _ = server
    api.record(Evaluation(published(sick_report()), NOW))
    current = version_of(Evaluation(published(sick_report()), NOW))
    # `get` gives up after 10 s: an answer held for the 20 s asked would fail here.
    for query in ("wait=20&version=0000000000000000", "wait=20", "wait=20&version="):
        status, _, answer = get(srv.port, TOKEN, query)
        assert status == 200 and answer["version"] == current
    assert api.waiting == 0


def test_a_reader_can_wait_for_the_first_evaluation(
    server: tuple[MetricsServer, HealthApi, Path],
) -> None:
    srv, api, _ = server
    status, _, answer = get(srv.port, TOKEN)
    assert status == 503 and answer["version"] == "" and answer["ready"] is False
    held = Held(srv.port, "wait=20&version=")
    held.start()
    until(lambda: api.waiting == 1)
    api.record(Evaluation((), NOW))
    held.join(15)
    assert held.answer is not None and held.elapsed < 15
    status, _, answer = held.answer
    assert status == 200 and answer["ready"] is True and answer["version"]


def test_bad_or_unauthenticated_long_polls_are_answered_at_once_and_counted(
    server: tuple[MetricsServer, HealthApi, Path],
) -> None:
    srv, api, _ = server
    status, _, answer = get(srv.port, TOKEN, "wait=-3&version=")
    assert status == 400 and "wait" in str(answer["error"])
    assert get(srv.port, TOKEN, "wait=nan")[0] == 400
    # Not ready and version "": an authorized request would wait, an unauthenticated one not.
    assert get(srv.port, None, "wait=20&version=")[0] == 401
    assert get(srv.port, "not-it", "wait=20&version=")[0] == 401
    assert get(srv.port, None, "wait=bogus")[0] == 401  # the token is checked first
    counts = encode_text(api.families()).decode()
    for outcome, n in [("bad_request", 2), ("no_credentials", 2), ("bad_credentials", 1)]:
        assert f'outcome="{outcome}"}} {n}\n' in counts
    assert api.waiting == 0


def test_at_most_16_wait_and_closing_releases_them(
    server: tuple[MetricsServer, HealthApi, Path],
) -> None:
    srv, api, _ = server
    held = [Held(srv.port, "wait=20&version=") for _ in range(MAX_WAITERS)]
    for request in held:
        request.start()
    until(lambda: api.waiting == MAX_WAITERS)
    status, _, answer = get(srv.port, TOKEN, "wait=20&version=")  # one more: at once
    assert status == 503 and answer["version"] == ""
    srv.shutdown()  # as `serve` stops: the held requests are let go by server_close
    srv.server_close()
    for request in held:
        request.join(15)
        assert request.answer is not None and request.answer[0] == 503
    assert api.waiting == 0


def test_a_server_without_a_health_api_answers_404() -> None:
    srv = MetricsServer(Published(), "127.0.0.1", 0)
    srv.timeout = 5
    thread = threading.Thread(target=srv.handle_request)
    thread.start()
    status, _, body = get(srv.port, TOKEN)
    thread.join()
    srv.server_close()
    assert status == 404 and "disabled" in str(body["error"])


# --- the real agent, end to end -----------------------------------------------------------------


def wait_for_port(proc: subprocess.Popen[bytes], log: Path) -> int:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = re.search(rb"serving metrics on http://127\.0\.0\.1:(\d+)/", log.read_bytes())
        if found:
            return int(found.group(1))
        assert proc.poll() is None, log.read_text()
        time.sleep(0.1)
    raise AssertionError(log.read_text())


def test_the_agent_serves_its_findings_and_file_labels_lose_to_node_labels(
    tmp_path: Path,
) -> None:
    """A simulated p5 with a fatal XID, no Kubernetes: /api/v1/health serves the XID as the
    annotation would, and the simulated Node's labels win over a topology file's."""
    token = tmp_path / "health-token"
    token.write_text(TOKEN + "\n")
    conf = tmp_path / "topology.conf"
    conf.write_text("SwitchName=file-top Nodes=sim-node\n")
    config = tmp_path / "node.yaml"
    config.write_text(
        f"health-token-file: {token}\ntopology-file: {conf}\nlisten: 127.0.0.1:0\n"
        "interval: 0.5\nnode-name: sim-node\n"
    )
    log = tmp_path / "agent.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "exporter.cli", "--log-level", "DEBUG", "node"),
                *("--simulate", "p5.48xlarge", "--fault", "xid=79@gpu3", "--no-kubernetes"),
                *("--config", str(config)),
            ],
            cwd=REPO,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        port = wait_for_port(proc, log)
        assert get(port)[0] == 401
        deadline = time.monotonic() + 30
        body: dict[str, object] = {}
        while time.monotonic() < deadline:
            status, _, body = get(port, TOKEN)
            if status == 200 and body["findings"]:
                break
            time.sleep(0.2)
        assert body["node"] == "sim-node" and body["ready"] is True
        findings, problems = decode_findings(json.dumps(body["findings"]))
        assert problems == []
        xid = next(f for f in findings if f.check == "xid")
        assert xid.component == "gpu3" and xid.actionable and xid.action != "none"
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/metrics")
        metrics = conn.getresponse().read()
        conn.close()
        assert topology_info(metrics)["layer1"] == "nn-4c1a0b7e5d2f9a31"  # the Node's, not file
        assert b"topowatch_node_health_api_requests_total{" in metrics
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert TOKEN not in log.read_text()


# --- the host install -------------------------------------------------------------------------


def install(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(INSTALL), *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_the_install_script_parses() -> None:
    assert subprocess.run(["bash", "-n", str(INSTALL)], check=False).returncode == 0


def test_install_writes_a_working_config_and_is_idempotent(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    prefix = tmp_path / "root"
    topology = fixture_topology("depth4-mixed-pages.json", "depth4-mixed-names.json")
    shared = tmp_path / "fsx"
    shared.mkdir()
    (shared / "topology.conf").write_text(slurm_tree(topology).text)
    (shared / "health-token").write_text(TOKEN + "\n")
    venv = Path(sys.executable).parent.parent
    common = ["--prefix", str(prefix), "--no-systemd", "--venv", str(venv)]
    files = ["--token-file", str(shared / "health-token")]
    files += ["--topology-file", str(shared / "topology.conf")]

    dry = install(*common, *files, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert not prefix.exists()  # a dry run changes nothing
    done = install(*common, *files)
    assert done.returncode == 0, done.stderr
    etc = prefix / "etc" / "topowatch"
    token = etc / "health-token"
    assert token.read_text().strip() == TOKEN
    assert token.stat().st_mode & 0o777 == 0o640
    assert (etc / "topology.conf").read_text() == (shared / "topology.conf").read_text()
    config = (etc / "node.yaml").read_text()
    assert f"topology-file: {etc / 'topology.conf'}" in config
    assert TOKEN not in done.stdout + done.stderr
    unit = (prefix / "etc" / "systemd" / "system" / "topowatch-node.service").read_text()
    assert f"ExecStart={venv}/bin/topowatch node --no-kubernetes --config {etc}/node.yaml" in unit

    (etc / "node.yaml").write_text(config + "interval: 7\n")  # an admin's edit
    again = install(*common, *files)
    assert again.returncode == 0, again.stderr
    assert (etc / "node.yaml").read_text() == config + "interval: 7\n"

    # The config written is one the agent runs with, on this node's placement.
    args = node_args("--config", str(etc / "node.yaml"), "--once", "--node-name", "ip-10-1-2-1")
    args.sysfs_root = args.proc_root = tmp_path
    args.no_kubernetes = True
    args.kernel_log = "off"
    assert run_node(args) == 0
    out = capsysbinary.readouterr().out
    assert topology_info(out)["layer3"] == "nn-3a000000000000a1"


def test_install_without_a_shared_token_generates_one_once(tmp_path: Path) -> None:
    prefix = tmp_path / "root"
    venv = Path(sys.executable).parent.parent
    common = ["--prefix", str(prefix), "--no-systemd", "--venv", str(venv)]
    first = install(*common)
    assert first.returncode == 0 and "a new health token" in first.stderr
    token = (prefix / "etc" / "topowatch" / "health-token").read_text()
    assert re.fullmatch(r"[0-9a-f]{64}", token)
    assert token not in first.stdout + first.stderr
    assert install(*common).returncode == 0
    assert (prefix / "etc" / "topowatch" / "health-token").read_text() == token


def test_install_refuses_what_it_cannot_use(tmp_path: Path) -> None:
    prefix = ["--prefix", str(tmp_path / "root"), "--no-systemd"]
    missing = install(*prefix, "--token-file", str(tmp_path / "absent"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    no_package = install(*prefix, "--venv", str(tmp_path / "empty-venv"))
    assert no_package.returncode == 2 and "give --wheel" in no_package.stderr
    both = install(*prefix, "--wheel", "a.whl", "--source", ".")
    assert both.returncode == 2
    assert install(*prefix, "--bogus").returncode == 2


def test_the_unit_runs_the_agent_confined() -> None:
    unit = configparser.ConfigParser(interpolation=None, strict=True)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string(UNIT.read_text())
    service = unit["Service"]
    assert (service["User"], service["Group"]) == ("topowatch", "topowatch")
    assert service["ExecStart"].startswith("/opt/topowatch/venv/bin/topowatch node --no-kubernetes")
    assert "--config /etc/topowatch/node.yaml" in service["ExecStart"]
    assert service["NoNewPrivileges"] == "yes"
    assert service["ProtectSystem"] == "strict" and service["ProtectHome"] == "yes"
    assert service["AmbientCapabilities"] == service["CapabilityBoundingSet"] == "CAP_SYSLOG"
    assert service["StateDirectory"] == "topowatch"
    assert service["ReadOnlyPaths"] == "/etc/topowatch"
    assert service["Restart"] == "on-failure"
    assert "video" in service["SupplementaryGroups"].split()
    # What would cut the agent off from /dev/nvidia*, /dev/kmsg or the EFA devices.
    assert "PrivateDevices" not in service and "ProtectKernelLogs" not in service
    assert unit["Install"]["WantedBy"] == "multi-user.target"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_systemd_accepts_the_installed_unit(tmp_path: Path) -> None:
    prefix = tmp_path / "root"
    venv = Path(sys.executable).parent.parent
    done = install("--prefix", str(prefix), "--no-systemd", "--venv", str(venv))
    assert done.returncode == 0, done.stderr
    installed = prefix / "etc" / "systemd" / "system" / "topowatch-node.service"
    assert systemd_verify(installed) == ""
