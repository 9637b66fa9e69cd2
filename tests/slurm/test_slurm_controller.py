"""`topowatch slurm-controller` against a real slurmctld 22.05 on loopback.

Rules the rows rest on:
- HyperPod replaces or reboots a Slurm node when told `scontrol update node=N state=fail
  reason="Action:Replace"` (or `Action:Reboot`) (SageMaker HyperPod developer guide, "Manually
  replace or reboot a node"; DESIGN.md).
- sinfo(1) NODE STATE CODES: DOWN, DRAIN (DRAINED/DRAINING), FAIL(ING) and NOT_RESPONDING are out
  of service; an admin's Reason on such a node is theirs, so the controller never touches it.
- The policy is the Kubernetes controller's (observe by default, budget, breaker, cooldown):
  tests/remediation/test_remediation_policy.py holds its tables; here only what Slurm changes.
Agents are loopback servers speaking the node agent's health API (tests/slurm_agents.py); each
node sits at its own 127.0.0.X NodeAddr, all agents on one port, as on a real cluster.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.core.exposition import encode_text
from exporter.slurm.reports import PENDING_REBOOT, PENDING_REPLACEMENT, asked_by_reason
from exporter.slurm.service import SlurmControllerService, build_app, build_service
from exporter.slurm.settings import settings_from_mapping
from exporter.sources.slurm.nodes import SlurmNode, parse_nodes
from tests.conftest import free_port
from tests.slurm_agents import TOKEN, Behaviour, FakeAgents, finding, loopback_addresses
from tests.slurm_harness import binary, running_slurmctld

NODES = ["gpu-1", "gpu-2", "gpu-3", "gpu-4"]
OURS = "topowatch: "
RB, RP = PENDING_REBOOT, PENDING_REPLACEMENT


def show(env: dict[str, str], node: str) -> dict[str, str]:
    """`scontrol show node` as key=value pairs (Reason runs to the end of its line)."""
    out = subprocess.run(
        [binary("scontrol"), "show", "node", node, "-o"],
        env=env,
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    ).stdout
    fields: dict[str, str] = {}
    head, _, reason = out.partition(" Reason=")
    for word in head.split():
        key, _, value = word.partition("=")
        fields[key] = value
    fields["Reason"] = reason.strip().split(" [", 1)[0] if reason else ""
    return fields


def scontrol(env: dict[str, str], *words: str) -> None:
    subprocess.run([binary("scontrol"), *words], env=env, check=True, timeout=10)


def config(tmp: Path, port: int, mode: str = "act", **extra: Any) -> dict[str, Any]:
    token = tmp / "health-token"
    token.write_text(TOKEN + "\n")
    raw: dict[str, Any] = {
        "cluster": "test",
        "interval_seconds": 1,
        "agents": {
            "port": port,
            "token_file": str(token),
            "timeout_seconds": 1.5,
            "watch_seconds": 0,  # poll each cycle: one_cycle() sees every answer
        },
        "slurm": {"timeout_seconds": 20},
        "remediation": {"state_file": str(tmp / "state.json"), "policy": {"mode": mode}},
        "prometheus": {"file_sd": str(tmp / "targets.json"), "placement": False},
        "listen": "127.0.0.1:0",
    }
    for key, value in extra.items():
        if isinstance(value, dict):
            raw.setdefault(key, {}).update(value)
        else:
            raw[key] = value
    return raw


def one_cycle(service: SlurmControllerService) -> None:
    """A cycle, then the decisions on what it read (the controller thread's job, done here)."""
    asyncio.run(service.cycle())
    service.controller.run_once()


@contextmanager
def cluster(tmp: Path) -> Iterator[tuple[dict[str, str], FakeAgents]]:
    addresses = loopback_addresses(NODES)
    agents = FakeAgents(addresses, free_port())
    with running_slurmctld(tmp, NODES, addresses=addresses) as env, agents.running():
        yield env, agents


def decisions(service: SlurmControllerService) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for record in service.controller.auditor.recent(500):
        out.setdefault(record["node"], []).append(f"{record['verdict']}:{record['reason']}")
    return out


# --- with the real slurmctld --------------------------------------------------------------------


@pytest.mark.real_component
def test_act_mode_asks_hyperpod_through_the_node_reason_and_leaves_others_alone(
    tmp_path: Path,
) -> None:
    now = time.time()
    with cluster(tmp_path) as (env, agents):
        # gpu-3: drained by an admin for maintenance, and its agent asks for a replacement too.
        scontrol(env, "update", "nodename=gpu-3", "state=drain", "reason=PSU swap (ticket 42)")
        agents.agents["gpu-2"] = Behaviour([finding("row_remap_failure", "replace", now - 60)])
        agents.agents["gpu-3"] = Behaviour([finding("row_remap_failure", "replace", now - 60)])
        agents.agents["gpu-4"] = Behaviour([finding("gpu_missing", "replace", now - 60, "gpu5")])
        service = build_service(settings_from_mapping(config(tmp_path, agents.port)), env)
        one_cycle(service)

        assert show(env, "gpu-2")["Reason"] == "Action:Replace"
        assert "FAIL" in show(env, "gpu-2")["State"]
        # gpu_missing climbs the ladder from a reboot (policy.DEFAULT_LADDER).
        assert show(env, "gpu-4")["Reason"] == "Action:Reboot"
        assert show(env, "gpu-3")["Reason"] == "PSU swap (ticket 42)"
        assert "FAIL" not in show(env, "gpu-3")["State"]
        assert show(env, "gpu-1")["Reason"] == ""
        said = decisions(service)
        assert "act:act" in said["gpu-2"] and "succeeded:provider" in said["gpu-2"]
        assert "skip:unavailable" in said["gpu-3"]
        state = json.loads((tmp_path / "state.json").read_text())["nodes"]
        assert state["gpu-2"]["outcome"] == "done" and state["gpu-2"]["action"] == "replace"
        assert "gpu-3" not in state

        # The next cycle: slurmctld's Reason says both are asked; nothing is asked twice.
        calls = service.controller.auditor.counts[("succeeded", "provider", "replace")]
        one_cycle(service)
        assert service.controller.auditor.counts[("succeeded", "provider", "replace")] == calls
        assert "skip:already_pending" in decisions(service)["gpu-2"]


@pytest.mark.real_component
def test_watch_mode_acts_when_the_agent_answers_its_long_poll(tmp_path: Path) -> None:
    """Watch mode: each agent holds one long poll from the controller and answers it when its
    findings change. A node turning bad after the only cycle is acted on from that answer: no
    second cycle runs, and the poll it answers has 20 s left when the action must be seen."""
    with cluster(tmp_path) as (env, agents):
        raw = config(tmp_path, agents.port)
        raw["agents"]["watch_seconds"] = 20
        service = build_service(settings_from_mapping(raw), env)
        seen: dict[str, str] = {}

        async def scenario() -> None:
            service.controller.start()
            try:
                await service.cycle()  # starts one watcher per agent
                # Every agent answered once, and gpu-2's long poll is open (its 2nd request).
                while service.counts.polls["ok"] < len(NODES) or (
                    sum(1 for n, _ in agents.requests if n == "gpu-2") < 2
                ):
                    await asyncio.sleep(0.05)
                asked_before = sum(1 for n, _ in agents.requests if n == "gpu-2")
                now = time.time()
                agents.set("gpu-2", Behaviour([finding("row_remap_failure", "replace", now)]))
                for _ in range(150):  # 15 s at most, before the 20 s long poll would expire
                    seen.update(await asyncio.to_thread(show, env, "gpu-2"))
                    if seen["Reason"]:
                        break
                    await asyncio.sleep(0.1)
                # The answer came on the long poll already open (plus at most the next one).
                seen["asked"] = str(sum(1 for n, _ in agents.requests if n == "gpu-2"))
                seen["before"] = str(asked_before)
            finally:
                await service.close()
                service.controller.stop()

        asyncio.run(scenario())
        assert seen["Reason"] == "Action:Replace"
        assert int(seen["asked"]) - int(seen["before"]) <= 1
        assert service.counts.cycles["ok"] == 1


@pytest.mark.real_component
def test_observe_mode_changes_nothing_in_slurmctld(tmp_path: Path) -> None:
    now = time.time()
    with cluster(tmp_path) as (env, agents):
        agents.agents["gpu-1"] = Behaviour([finding("row_remap_failure", "replace", now - 60)])
        raw = config(tmp_path, agents.port, mode="observe")
        service = build_service(settings_from_mapping(raw), env)
        one_cycle(service)
        assert show(env, "gpu-1")["Reason"] == ""
        assert "skip:observe" in decisions(service)["gpu-1"]


@pytest.mark.real_component
def test_opt_out_by_feature_or_list(tmp_path: Path) -> None:
    now = time.time()
    with cluster(tmp_path) as (env, agents):
        scontrol(
            env,
            "update",
            "nodename=gpu-1",
            "availablefeatures=topowatch_remediation_disabled",
            "activefeatures=topowatch_remediation_disabled",
        )
        for node in ("gpu-1", "gpu-2"):
            agents.agents[node] = Behaviour([finding("row_remap_failure", "replace", now - 60)])
        raw = config(tmp_path, agents.port, slurm={"exclude_nodes": ["gpu-[2-3]"]})
        service = build_service(settings_from_mapping(raw), env)
        one_cycle(service)
        assert show(env, "gpu-1")["Reason"] == show(env, "gpu-2")["Reason"] == ""
        said = decisions(service)
        assert "skip:opted_out" in said["gpu-1"] and "skip:opted_out" in said["gpu-2"]


@pytest.mark.real_component
def test_bad_agents_are_counted_and_audited_and_never_acted_on(tmp_path: Path) -> None:
    """A garbage answer, a hang, another node's name, a wrong token: no findings believed."""
    now = time.time()
    asking = [finding("row_remap_failure", "replace", now - 60)]
    with cluster(tmp_path) as (env, agents):
        agents.agents["gpu-1"] = Behaviour(asking, mode="garbage")
        agents.agents["gpu-2"] = Behaviour(asking, mode="hang", hang_s=4)
        agents.agents["gpu-3"] = Behaviour(asking, mode="as:gpu-9")
        agents.agents["gpu-4"] = Behaviour(asking, mode="status:500")
        service = build_service(settings_from_mapping(config(tmp_path, agents.port)), env)
        one_cycle(service)
        for node in NODES:
            assert show(env, node)["Reason"] == "", node
        polls = service.counts.polls
        assert (polls["garbage"], polls["timeout"], polls["wrong_node"], polls["bad_status"]) == (
            1,
            1,
            1,
            1,
        )
        problems = service.controller.auditor.problems
        assert problems["agent_garbage"] == problems["agent_wrong_node"] == 1
        # The same failure next cycle is counted again but audited once.
        one_cycle(service)
        assert service.counts.polls["garbage"] == 2 and problems["agent_garbage"] == 1

    (tmp_path / "token").mkdir()
    with cluster(tmp_path / "token") as (env, agents):
        agents.agents["gpu-1"] = Behaviour(asking)
        raw = config(tmp_path, agents.port)
        Path(raw["agents"]["token_file"]).write_text("not-the-token\n")
        service = build_service(settings_from_mapping(raw), env)
        one_cycle(service)
        assert service.counts.polls["unauthorized"] == len(NODES)
        assert show(env, "gpu-1")["Reason"] == ""


@pytest.mark.real_component
def test_slurmctld_down_holds_everything_and_keeps_serving(tmp_path: Path) -> None:
    now = time.time()
    with cluster(tmp_path) as (env, agents):
        # gpu-1 asks for a replacement; the budget (0 nodes) holds it for now.
        agents.agents["gpu-1"] = Behaviour([finding("row_remap_failure", "replace", now - 60)])
        raw = config(tmp_path, agents.port)
        raw["remediation"]["policy"]["budget"] = {"nodes": 0, "percent": 0}
        service = build_service(settings_from_mapping(raw), env)
        one_cycle(service)
        assert "skip:budget_concurrent" in decisions(service)["gpu-1"]
        targets = json.loads((tmp_path / "targets.json").read_text())
        assert {t["labels"]["node"] for t in targets} == set(NODES)
    # slurmctld has stopped.
    calls = sum(n for (v, r, _), n in service.controller.auditor.counts.items() if r == "provider")
    one_cycle(service)
    assert service.counts.cycles["slurmctld_error"] == 1
    # sinfo --json exits 0 and says `errors: [Unspecified error]`: counted as slurm's failure.
    assert service.counts.command_failures[("nodes", "failed")] == 1
    assert "skip:slurmctld_unreachable" in decisions(service)["gpu-1"]
    after = sum(n for (v, r, _), n in service.controller.auditor.counts.items() if r == "provider")
    assert after == calls
    assert json.loads((tmp_path / "targets.json").read_text()) == targets  # kept as it was

    async def probe() -> tuple[int, str, int]:
        from aiohttp.test_utils import TestClient, TestServer

        async with TestClient(TestServer(build_app(service, admin_token=None))) as client:
            health = await client.get("/healthz")
            metrics = await client.get("/metrics")
            reset = await client.post("/api/v1/remediation/reset")
            return health.status, await metrics.text(), reset.status

    health, metrics, reset = asyncio.run(probe())
    assert health == 200
    assert 'topowatch_slurm_controller_cycles_total{result="slurmctld_error"} 1' in metrics
    assert reset == 403  # no admin token configured: nothing can reset the breaker


@pytest.mark.real_component
def test_scontrol_that_fails_is_an_audited_failure_not_a_crash(tmp_path: Path) -> None:
    now = time.time()
    with cluster(tmp_path) as (env, agents):
        agents.agents["gpu-2"] = Behaviour([finding("row_remap_failure", "replace", now - 60)])
        wrappers = tmp_path / "bin"
        wrappers.mkdir()
        for name in ("sinfo", "squeue"):
            (wrappers / name).symlink_to(binary(name))
        (wrappers / "scontrol").write_text(
            '#!/bin/sh\ncase "$*" in *update*) echo "slurm_update error: Access denied" >&2;'
            f' exit 1;; esac\nexec {binary("scontrol")} "$@"\n'
        )
        (wrappers / "scontrol").chmod(0o755)
        raw = config(tmp_path, agents.port, slurm={"bin_dir": str(wrappers)})
        service = build_service(settings_from_mapping(raw), env)
        one_cycle(service)
        assert show(env, "gpu-2")["Reason"] == ""
        assert "failed:provider" in decisions(service)["gpu-2"]
        state = json.loads((tmp_path / "state.json").read_text())["nodes"]["gpu-2"]
        assert state["outcome"] == "failed" and "Access denied" in state["message"]


@pytest.mark.real_component
def test_prometheus_discovers_every_agent_from_the_file_sd_targets(tmp_path: Path) -> None:
    """A real Prometheus with `file_sd_configs` on the file the controller writes scrapes every
    agent, each series labelled with its cluster, partition and node."""
    from tests.deploy.test_prometheus_e2e import Prometheus

    with cluster(tmp_path) as (env, agents):
        service = build_service(settings_from_mapping(config(tmp_path, agents.port)), env)
        one_cycle(service)
        prometheus_yml = tmp_path / "prometheus.yml"
        prometheus_yml.write_text(
            json.dumps(
                {
                    "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
                    "scrape_configs": [
                        {
                            "job_name": "topowatch-node",
                            "file_sd_configs": [
                                {
                                    "files": [str(tmp_path / "targets.json")],
                                    "refresh_interval": "1s",
                                }
                            ],
                        }
                    ],
                }
            )
        )
        (tmp_path / "prom").mkdir()
        prometheus = Prometheus.launch(prometheus_yml, tmp_path / "prom")
        try:
            prometheus.wait_for(
                'count(up{job="topowatch-node",cluster="test",partition="all"} == 1) == 4',
                30,
                "four agents scraped through file_sd",
            )
            series = prometheus.query("topowatch_node_info")
            assert {(s["metric"]["node"], s["metric"]["instance"]) for s in series} == {
                (node, f"{address}:{agents.port}") for node, address in agents.addresses.items()
            }
        finally:
            prometheus.stop()


@pytest.mark.real_component
@pytest.mark.skipif(os.geteuid() != 0, reason="slurmd runs jobs as root here")
def test_running_job_placement_and_remediation_in_one_cycle(tmp_path: Path) -> None:
    """slurmd runs on every node: an sbatch job spread over two leaf switches shows up in the
    controller's /metrics with the Kueue side's metric names and scheduler="slurm", and a bad
    node running that job is still sent to HyperPod (it requeues the job)."""
    topology = "SwitchName=sw-top Switches=sw-a,sw-b\nSwitchName=sw-a Nodes=gpu-[1-2]\n"
    topology += "SwitchName=sw-b Nodes=gpu-[3-4]\n"
    addresses = loopback_addresses(NODES)
    agents = FakeAgents(addresses, free_port())
    with (
        running_slurmctld(tmp_path, NODES, topology, slurmd=True, addresses=addresses) as env,
        agents.running(),
    ):
        spread = ["-J", "spread", "-N", "2", "-w", "gpu-2,gpu-3", "--wrap", "sleep 300"]
        job = subprocess.run(
            [binary("sbatch"), "--parsable", "-o", "/dev/null", *spread],
            env=env,
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=30,
            check=True,
        ).stdout.strip()
        _wait_for(lambda: show(env, "gpu-3")["State"].startswith(("ALLOC", "MIXED")), "job start")
        agents.agents["gpu-3"] = Behaviour([finding("row_remap_failure", "replace", time.time())])
        raw = config(tmp_path, agents.port, topology_file=str(tmp_path / "topology.conf"))
        raw["prometheus"]["placement"] = True
        service = build_service(settings_from_mapping(raw), env)
        one_cycle(service)
        assert show(env, "gpu-3")["Reason"] == "Action:Replace"
        text = encode_text(service.families()).decode()
        hops = [
            line
            for line in text.splitlines()
            if line.startswith("topowatch_workload_worst_pair_hops{") and f'job_id="{job}"' in line
        ]
        assert len(hops) == 1 and 'scheduler="slurm"' in hops[0], text[-3000:]
        assert hops[0].endswith(" 4")  # two leaf switches under one spine (labels.hops)


@pytest.mark.real_component
def test_a_real_node_agent_with_an_xid_79_is_rebooted_through_hyperpods_reason(
    tmp_path: Path,
) -> None:
    """The real `topowatch node` (simulated p5 hardware, XID 79 injected, no Kubernetes) behind
    its health API, and the controller polling it: the same findings the EKS annotation would
    carry lead to `Action:Reboot` (XID 79's first ladder step) on the real slurmctld."""
    addresses = loopback_addresses(NODES)
    port = free_port()
    token = tmp_path / "health-token"
    token.write_text(TOKEN + "\n")
    topowatch = Path(sys.executable).with_name("topowatch")
    argv = ["node", "--simulate", "p5.48xlarge", "--fault", "xid=79@gpu3", "--no-kubernetes"]
    argv += ["--node-name", "gpu-1", "--health-token-file", str(token), "--interval", "1"]
    argv += ["--listen", f"{addresses['gpu-1']}:{port}", "--kernel-log", "off"]
    argv += ["--sim-root", str(tmp_path / "sim")]
    agent = subprocess.Popen(
        [str(topowatch), *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:

        def asks() -> bool:
            request = urllib.request.Request(
                f"http://{addresses['gpu-1']}:{port}/api/v1/health",
                headers={"Authorization": f"Bearer {TOKEN}"},
            )
            try:
                with urllib.request.urlopen(request, timeout=2) as answer:
                    body = json.load(answer)
            except (OSError, ValueError):
                return False
            return any(f["actionable"] for f in body["findings"])

        _wait_for(asks, "the agent's actionable XID 79 finding")
        with running_slurmctld(tmp_path / "slurm", NODES, addresses=addresses) as env:
            raw = config(tmp_path, port)
            service = build_service(settings_from_mapping(raw), env)
            one_cycle(service)
            assert service.counts.polls["ok"] == 1  # the other agents do not exist: unreachable
            assert show(env, "gpu-1")["Reason"] == "Action:Reboot"
            assert all(show(env, n)["Reason"] == "" for n in NODES[1:])
    finally:
        agent.terminate()
        agent.wait(timeout=30)


# --- a restart in the middle of an action ---------------------------------------------------------


def _wrappers(tmp: Path) -> Path:
    """scontrol that logs every update; a flag file makes it hang before or after the real call
    (the window a crash of the controller can fall into)."""
    wrappers = tmp / "bin"
    wrappers.mkdir()
    for name in ("sinfo", "squeue"):
        (wrappers / name).symlink_to(binary(name))
    log, flag = tmp / "scontrol.log", tmp / "hang"
    (wrappers / "scontrol").write_text(
        f"""#!/bin/sh
case "$*" in
  *update*)
    echo "asked $*" >> {log}
    if [ "$(cat {flag} 2>/dev/null)" = before ]; then sleep 600; fi
    {binary("scontrol")} "$@" || exit $?
    echo "done $*" >> {log}
    if [ "$(cat {flag} 2>/dev/null)" = after ]; then sleep 600; fi
    exit 0;;
esac
exec {binary("scontrol")} "$@"
"""
    )
    (wrappers / "scontrol").chmod(0o755)
    return wrappers


def _controller(config_file: Path, env: dict[str, str], once: bool) -> subprocess.Popen[str]:
    topowatch = Path(sys.executable).with_name("topowatch")
    argv = [str(topowatch), "slurm-controller", "--config", str(config_file)]
    return subprocess.Popen(
        [*argv, "--once"] if once else argv,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its scontrol children die with it
    )


def _wait_for(condition: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


def _lines(path: Path, prefix: str) -> list[str]:
    if not path.exists():
        return []
    return [x for x in path.read_text().splitlines() if x.startswith(prefix)]


@pytest.mark.real_component
def test_nodes_turning_bad_together_cost_one_scontrol_call(tmp_path: Path) -> None:
    """Three nodes asking for a replacement in one round: one `scontrol update nodename=a,b,c`
    (each call takes slurmctld's node lock; one by one they queue behind each other)."""
    now = time.time()
    with cluster(tmp_path) as (env, agents):
        for node in ("gpu-1", "gpu-2", "gpu-4"):
            agents.agents[node] = Behaviour([finding("row_remap_failure", "replace", now - 60)])
        wrappers = _wrappers(tmp_path)
        raw = config(tmp_path, agents.port, slurm={"bin_dir": str(wrappers)})
        raw["remediation"]["policy"]["budget"] = {"nodes": 10}
        service = build_service(settings_from_mapping(raw), env)
        asyncio.run(service.cycle())
        service.controller.run_once(timeout=5)
        calls = _lines(tmp_path / "scontrol.log", "done ")
        assert len(calls) == 1, calls
        assert "nodename=gpu-1,gpu-2,gpu-4 state=fail reason=Action:Replace" in calls[0]
        assert {show(env, n)["Reason"] for n in ("gpu-1", "gpu-2", "gpu-4")} == {"Action:Replace"}


@pytest.mark.real_component
def test_a_full_disk_means_no_action(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The `requested` record cannot be written (ENOSPC): nothing is asked of slurmctld, since a
    restart could not know it had been; each node's failure is audited."""
    now = time.time()
    with cluster(tmp_path) as (env, agents):
        for node in ("gpu-1", "gpu-2"):
            agents.agents[node] = Behaviour([finding("row_remap_failure", "replace", now - 60)])
        service = build_service(settings_from_mapping(config(tmp_path, agents.port)), env)

        def full(*_: Any) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(service.state_file, "_write", full)
        one_cycle(service)
        assert show(env, "gpu-1")["Reason"] == show(env, "gpu-2")["Reason"] == ""
        assert service.controller.auditor.problems["state_write_failed"] == 2
        assert not (tmp_path / "state.json").exists()


@pytest.mark.real_component
@pytest.mark.parametrize("crash", ["after", "before", "before-healed"])
def test_restart_mid_action_neither_repeats_nor_forgets(tmp_path: Path, crash: str) -> None:
    """The controller is killed (SIGKILL) while scontrol runs: `after` the real update went
    through, or `before` it did. A restarted controller reads its state file (`requested`) and
    slurmctld's Reason: `after` → confirmed, no second call; `before` → carried out, once, as
    the node still asks for it; `before-healed` → the node is healthy again: withdrawn, no call
    (when in doubt, do not act)."""
    now = time.time()
    with cluster(tmp_path) as (env, agents):
        agents.agents["gpu-2"] = Behaviour([finding("row_remap_failure", "replace", now - 60)])
        wrappers = _wrappers(tmp_path)
        (tmp_path / "hang").write_text(crash.split("-")[0])
        config_file = tmp_path / "controller.yaml"
        raw = config(tmp_path, agents.port, slurm={"bin_dir": str(wrappers)})
        raw["agents"]["watch_seconds"] = 25  # as shipped; `--once` below asks every agent
        config_file.write_text(yaml.safe_dump(raw))
        log = tmp_path / "scontrol.log"

        first = _controller(config_file, env, once=False)
        try:
            marker = "done " if crash == "after" else "asked "
            _wait_for(lambda: _lines(log, marker), f"scontrol update ({crash})")
            os.killpg(first.pid, signal.SIGKILL)
        finally:
            first.wait(timeout=30)
        state = json.loads((tmp_path / "state.json").read_text())["nodes"]["gpu-2"]
        assert state["outcome"] == "requested"
        assert (show(env, "gpu-2")["Reason"] == "Action:Replace") == (crash == "after")

        (tmp_path / "hang").unlink()
        if crash == "before-healed":
            agents.agents["gpu-2"] = Behaviour([])
        second = _controller(config_file, env, once=True)
        output, _ = second.communicate(timeout=120)
        assert second.returncode == 0, output

        state = json.loads((tmp_path / "state.json").read_text())["nodes"]["gpu-2"]
        if crash == "before-healed":
            assert _lines(log, "done ") == [] and show(env, "gpu-2")["Reason"] == ""
            assert state["outcome"] == "failed" and "withdrawn: node healthy" in state["message"]
            return
        assert len(_lines(log, "done ")) == 1, log.read_text()
        assert show(env, "gpu-2")["Reason"] == "Action:Replace"
        assert state["outcome"] == "done" and state["attempts"] == 1
        assert ("slurmctld shows" in state["message"]) == (crash == "after")
        assert ("resumed after a restart" in state["message"]) == (crash == "before")


# --- issue 28: what slurm.conf must have, and an admin's drain in between ------------------------


@pytest.mark.real_component
def test_reboot_asap_without_a_reboot_program_is_refused_at_start(tmp_path: Path) -> None:
    """`scontrol reboot` needs slurm.conf's RebootProgram (scontrol(1), "reboot"; slurmctld
    answers "RebootProgram isn't defined" otherwise): without it `reboot-asap` would fail at
    every decision, so the start is refused, in one line, before anything is decided."""
    from exporter.slurm.settings import SettingsError

    addresses = loopback_addresses(NODES)
    with running_slurmctld(tmp_path / "bare", NODES, addresses=addresses) as env:
        raw = config(tmp_path, free_port(), slurm={"method": "reboot-asap"})
        with pytest.raises(SettingsError, match=r"RebootProgram = \(null\)") as refused:
            build_service(settings_from_mapping(raw), env)
        assert "\n" not in str(refused.value) and "slurm.method" in str(refused.value)
        config_file = tmp_path / "controller.yaml"
        config_file.write_text(yaml.safe_dump(raw))
        done = _controller(config_file, env, once=True)
        output, _ = done.communicate(timeout=60)
        assert done.returncode == 2
        [line] = output.strip().splitlines()
        assert line.startswith("topowatch slurm-controller: slurm.method reboot-asap needs")
        build_service(settings_from_mapping({**raw, "slurm": {"method": "drain"}}), env)

    with running_slurmctld(
        tmp_path / "set", NODES, addresses=addresses, extra_conf=["RebootProgram=/bin/true"]
    ) as env:
        service = build_service(settings_from_mapping(raw), env)
        assert service.settings.method == "reboot-asap"


@pytest.mark.real_component
def test_an_admins_drain_between_the_read_and_the_write_is_not_overwritten(
    tmp_path: Path,
) -> None:
    """The decision rests on the node list of the cycle; an admin drains the node before the
    controller writes. `scontrol update state=fail reason=...` would replace the admin's state
    and Reason (scontrol(1): the reason "will replace any previous reason"), so the node is
    read again right before the write and left as the admin left it: deferred, not an attempt,
    audited with what slurmctld shows; the next cycle holds it as someone else's."""
    now = time.time()
    with cluster(tmp_path) as (env, agents):
        for node in ("gpu-1", "gpu-2"):
            agents.agents[node] = Behaviour([finding("row_remap_failure", "replace", now - 60)])
        service = build_service(settings_from_mapping(config(tmp_path, agents.port)), env)
        asyncio.run(service.cycle())  # gpu-2 read in service; the decisions are queued
        scontrol(env, "update", "nodename=gpu-2", "state=drain", "reason=PSU swap (ticket 42)")
        service.controller.run_once()

        assert show(env, "gpu-2")["Reason"] == "PSU swap (ticket 42)"
        assert "FAIL" not in show(env, "gpu-2")["State"]
        assert show(env, "gpu-1")["Reason"] == "Action:Replace"  # the other one as decided
        [deferred] = [
            r
            for r in service.controller.auditor.recent(100)
            if r["node"] == "gpu-2" and r["verdict"] == "deferred"
        ]
        assert (
            "not written: slurmctld now shows UNKNOWN+DRAIN (PSU swap (ticket 42))"
            in (deferred["detail"])
        )  # (no slurmd here: UNKNOWN is the base state)
        state = json.loads((tmp_path / "state.json").read_text())["nodes"]["gpu-2"]
        assert (state["outcome"], state["attempts"]) == ("deferred", 0)

        one_cycle(service)
        assert show(env, "gpu-2")["Reason"] == "PSU swap (ticket 42)"
        assert "skip:unavailable" in decisions(service)["gpu-2"]


# --- pieces, no slurmctld -------------------------------------------------------------------------


def _node(**fields: Any) -> SlurmNode:
    entry = {"name": "gpu-1", "state": "idle", "state_flags": [], "reason": "", **fields}
    [node], problems = parse_nodes(json.dumps({"nodes": [entry]}))
    assert problems == []
    return node


@pytest.mark.parametrize(
    ("entry", "out_of_service", "asked"),
    [
        # sinfo(1): IDLE in service; DRAIN flag drained/draining; DOWN; FAIL.
        ({"state": "idle"}, False, ""),
        ({"state": "allocated", "state_flags": ["DRAIN"], "reason": "maint"}, True, ""),
        ({"state": "down", "reason": "Not responding"}, True, ""),
        # HyperPod's reasons on a FAILed node: asked, pending (the EKS label's meaning).
        ({"state": "idle", "state_flags": ["FAIL"], "reason": "Action:Replace"}, True, RP),
        ({"state": "idle", "state_flags": ["FAIL"], "reason": "Action:Reboot"}, True, RB),
        # Our own drain reasons.
        ({"state": "idle", "state_flags": ["DRAIN"], "reason": OURS + "reboot: x"}, True, RB),
        ({"state": "mixed", "state_flags": ["DRAIN"], "reason": OURS + "replace: x"}, True, RP),
        # A stale reason on a node back in service asks nothing.
        ({"state": "idle", "reason": "Action:Reboot"}, False, ""),
        # v0.0.39+ shape: one list, base state first.
        ({"state": ["IDLE", "DRAIN"], "reason": "Action:Reboot"}, True, RB),
    ],
)
def test_node_states_and_reasons(entry: dict[str, Any], out_of_service: bool, asked: str) -> None:
    node = _node(**entry)
    assert node.out_of_service == out_of_service
    assert asked_by_reason(node) == asked


@pytest.mark.real_component
def test_unreadable_state_file_holds_every_node_and_is_never_overwritten(tmp_path: Path) -> None:
    """The file may hold the only record of an action under way: a controller that cannot read
    it must not act (it could repeat that action), nor replace it; it says so and keeps serving."""
    now = time.time()
    with cluster(tmp_path) as (env, agents):
        agents.agents["gpu-1"] = Behaviour([finding("row_remap_failure", "replace", now - 60)])
        (tmp_path / "state.json").write_text('{"version": 1, "nodes": {"gpu-1": {"act')
        service = build_service(settings_from_mapping(config(tmp_path, agents.port)), env)
        one_cycle(service)
        assert show(env, "gpu-1")["Reason"] == ""
        assert "skip:malformed_state" in decisions(service)["gpu-1"]
        assert (tmp_path / "state.json").read_text().endswith('"act')
        assert "topowatch_slurm_state_file_ok 0" in encode_text(service.families()).decode()

        newer = '{"version": 2, "nodes": {}}'
        (tmp_path / "state.json").write_text(newer)
        service = build_service(settings_from_mapping(config(tmp_path, agents.port)), env)
        one_cycle(service)
        assert service.state_problem is not None and "version 2" in service.state_problem
        assert (tmp_path / "state.json").read_text() == newer


# --- the health API answer, the poller, the state file, the settings ------------------------------


def _body(**fields: Any) -> bytes:
    base: dict[str, Any] = {"node": "gpu-1", "ready": True, "findings": []}
    return json.dumps({**base, **fields}).encode()


GOOD = finding("xid", "reboot", 1_795_000_000.0).to_dict()


@pytest.mark.parametrize(
    ("status", "body", "outcome", "findings"),
    [
        # exporter/node/health_api.py: 200 with the annotation's findings list.
        (200, _body(findings=[GOOD]), "ok", 1),
        (200, _body(), "ok", 0),
        # 401 without or with a wrong token; 503 before the first evaluation.
        (401, b'{"error": "bearer token required"}', "unauthorized", 0),
        (503, _body(ready=False), "not_ready", 0),
        (200, _body(ready=False), "not_ready", 0),
        # An address that now belongs to another host must not lend it its findings.
        (200, _body(node="gpu-7", findings=[GOOD]), "wrong_node", 0),
        (200, b"<html>proxy login</html>", "garbage", 0),
        (200, b'{"findings": "none"}', "garbage", 0),
        (200, b"[]", "garbage", 0),
        (404, b"{}", "bad_status", 0),
        # One unreadable finding: the rest is believed, the bad one is a problem.
        (200, _body(findings=[GOOD, {"check": "x"}]), "ok", 1),
    ],
)
def test_health_answers(status: int, body: bytes, outcome: str, findings: int) -> None:
    from exporter.slurm.poller import read_answer

    reading = read_answer("gpu-1", status, body, 1.0)
    assert (reading.outcome, len(reading.findings)) == (outcome, findings)
    assert reading.ok == (outcome == "ok")
    if b'"check": "x"' in body:
        assert len(reading.problems) == 1


def test_poller_keeps_to_its_concurrency_bound(tmp_path: Path) -> None:
    """40 agents each answering after 0.2 s, at most 8 requests in flight at any time."""
    from exporter.slurm.poller import AgentPoller, Target

    names = [f"n{i}" for i in range(40)]
    addresses = {n: f"127.0.1.{i + 2}" for i, n in enumerate(names)}
    agents = FakeAgents(addresses, free_port())
    for name in names:
        agents.agents[name] = Behaviour(mode="hang", hang_s=0.2)
    poller = AgentPoller(TOKEN, agents.port, timeout_s=5, concurrency=8)
    with agents.running():
        readings = asyncio.run(poller.poll([Target(n, addresses[n]) for n in names]))
    assert [r.node for r in readings] == names
    assert len(agents.requests) == 40
    starts = sorted(t for _, t in agents.requests)
    # Any 9 consecutive request starts span at least one answer's 0.2 s: never 9 at once.
    assert min(b - a for a, b in zip(starts, starts[8:], strict=False)) >= 0.15


def test_state_file_round_trip_and_atomic_replacement(tmp_path: Path) -> None:
    from exporter.slurm.statefile import StateFile
    from healthcheck.remediation.state import RemediationState

    path = tmp_path / "lib" / "state.json"
    store = StateFile(path)
    assert store.load() == {}
    first = RemediationState("reboot", 100.0, "slurm", 1, "requested")
    store.write_state("gpu-1", first)
    store.write_state("gpu-2", RemediationState("replace", 200.0, "slurm", 2, "done"))
    store.drop("gpu-2")
    assert StateFile(path).load() == {"gpu-1": first}
    assert oct(path.stat().st_mode & 0o777) == "0o640"
    assert [p.name for p in path.parent.iterdir()] == ["state.json"]  # no temp file left


@pytest.mark.parametrize(
    ("raw", "complaint"),
    [
        ({"agents": {"prot": 1}}, "unknown setting"),
        ({"slurm": {"method": "reboot-now"}}, "slurm.method"),
        ({"remediation": {"policy": {"mode": "yolo"}}}, "observe|act"),
        ({"agents": {"concurrency": 0}}, "concurrency"),
        ({"slurm": {"exclude_nodes": ["gpu-[3-1]"]}}, "exclude_nodes"),
        ({"listen": "0.0.0.0:http"}, "listen port"),
    ],
)
def test_bad_settings_stop_the_start_with_a_clear_message(raw: Any, complaint: str) -> None:
    from exporter.slurm.settings import SettingsError

    with pytest.raises(SettingsError, match=re.escape(complaint)):
        settings_from_mapping(raw)
    defaults = settings_from_mapping({})
    assert defaults.policy.mode == "observe" and defaults.method == "hyperpod"


@pytest.mark.parametrize("name", ["gpu-1;reboot", "gpu-1 state=idle", "$(id)", "gpu-1,gpu-2", ""])
def test_shell_metacharacters_in_a_node_name_are_refused_before_scontrol(
    tmp_path: Path, name: str
) -> None:
    from exporter.sources.slurm.commands import SlurmCli, SlurmCommandError

    called = tmp_path / "called"
    fake = tmp_path / "scontrol"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {called}\n')
    fake.chmod(0o755)
    cli = SlurmCli(bin_dir=str(tmp_path))
    with pytest.raises(SlurmCommandError, match="unsafe Slurm node name"):
        cli.update_nodes([name], "fail", "Action:Reboot")
    assert not called.exists()
    cli.update_nodes(["gpu-1"], "drain", "topowatch: reboot: xid@gpu3; rm -rf /\nnext")
    said = "update nodename=gpu-1 state=drain reason=topowatch: reboot: xid@gpu3; rm -rf / next"
    assert called.read_text() == said + "\n"  # one argv word, the newline flattened
