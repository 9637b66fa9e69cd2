"""`topowatch quota advise` from a kubectl dump and from a service: the table, JSON, emitted
UpdateComputeQuota requests (validated by botocore's model) and ClusterQueue merge patches
(validated against the Kueue CRD once merged), and --apply through botocore's Stubber."""

from __future__ import annotations

import argparse
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import botocore.session
import pytest
import yaml
from botocore.stub import Stubber
from botocore.validate import validate_parameters

from exporter.cli import quota_advise as quota_cli
from exporter.cli.quota import add_quota_parser
from exporter.cluster.quota.advisor import Recommendation
from exporter.cluster.quota.emit import update_input_shape
from exporter.cluster.quota.views import recommendations_view
from exporter.core.mergepatch import merge_patch
from exporter.sim import synthetic as s
from tests.crds import assert_valid_kueue

T0 = 1_795_000_000.0
L3 = "topology.k8s.aws/network-node-layer-3"
FLAVOR = "ml.p5.48xlarge"
IDS = {"idle": "aaaaaaaaaaaa", "borrow": "bbbbbbbbbbbb", "wide": "cccccccccccc"}


def cq(team: str) -> str:
    return f"hyperpod-ns-{team}-clusterqueue"


def dump_objects() -> list[dict[str, Any]]:
    """One snapshot of a 128-GPU cluster (4 layer-3 domains of 32): `idle` uses 8 of 32 and
    lends nothing, `borrow` uses 24 on a quota of 8, `wide` waits for 48 GPUs in one domain."""
    objs: list[dict[str, Any]] = []
    nodes = [f"node-{d}-{i}" for d in range(4) for i in range(4)]
    for name in nodes:
        d = int(name.split("-")[1])
        objs.append(s.node(name, ("nn-l1", f"nn-l2-{d // 2}", f"nn-l3-{d}")))
    queues = [
        s.cluster_queue(cq("idle"), 32, used=8, lending_limit=0),
        s.cluster_queue(cq("borrow"), 8, used=24, borrowed=16),
        s.cluster_queue(cq("wide"), 32),
    ]
    queues[1]["spec"]["fairSharing"] = {"weight": "2"}
    queues[0]["spec"]["resourceGroups"][0]["coveredResources"].append("cpu")
    queues[0]["spec"]["resourceGroups"][0]["flavors"][0]["resources"].append(
        {"name": "cpu", "nominalQuota": "1000"}
    )
    objs.extend(queues)
    objs.extend(s.local_queue(f"hyperpod-ns-{t}", cq(t)) for t in IDS)
    for team, name, placed in (("idle", "small", nodes[:1]), ("borrow", "big", nodes[4:7])):
        wl = s.workload(
            f"hyperpod-ns-{team}",
            name,
            len(placed),
            8,
            T0,
            conditions=s.admitted_conditions(cq(team), T0 + 1),
            cluster_queue=cq(team),
            assignment=[((n,), 1) for n in placed],
        )
        objs.append(wl)
        uid = wl["metadata"]["labels"]["kueue.x-k8s.io/job-uid"]
        ns = f"hyperpod-ns-{team}"
        objs.extend(s.pod(ns, f"{name}-{i}", n, 8, uid, name, name) for i, n in enumerate(placed))
    message = s.quota_message(16)
    objs.append(
        s.workload(
            "hyperpod-ns-wide",
            "needs-48",
            6,
            8,
            T0 + 5,
            topology=("required", L3),
            conditions=[s.condition("QuotaReserved", "False", "Pending", message, T0 + 5)],
        )
    )
    for obj in objs:
        if obj["apiVersion"].startswith("kueue.x-k8s.io/"):
            assert_valid_kueue(obj)
    return objs


@pytest.fixture(scope="module")
def dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("quota") / "dump.yaml"
    items = dump_objects()
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}))
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """The command as `topowatch` runs it, through the parser the integrator adds."""
    parser = argparse.ArgumentParser(prog="topowatch")
    add_quota_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    code = int(args.func(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_table_and_json_from_a_dump(dump: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "quota", "advise", "--from", str(dump))
    assert code == 0
    rows = {tuple(line.split()[:3]) for line in out.splitlines() if line.startswith("hyperpod")}
    assert rows == {
        (cq("idle"), "idle", "nominal"),
        (cq("idle"), "idle", "lending_limit"),
        (cq("borrow"), "borrow", "nominal"),
        (cq("borrow"), "borrow", "borrowing_limit"),
        (cq("wide"), "wide", "topology_fit"),
    }
    assert "in the one snapshot seen" in out
    code, out, _ = run(capsys, "quota", "advise", "--from", str(dump), "--json")
    view = {(v["team"], v["kind"]): v for v in json.loads(out)}
    assert (view["borrow", "nominal"]["current"], view["borrow", "nominal"]["recommended"]) == (
        8,
        24,
    )
    assert view["wide", "topology_fit"]["reason"] == "unplaceable_at_level"
    assert ("wide", "nominal") not in view  # more quota would not place a 48-GPU job


def test_emit_kueue_patches_validate_against_the_crd(
    dump: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "quota", "advise", "--from", str(dump), "--emit", "kueue")
    assert code == 0
    items = {item["cluster_queue"]: item for item in json.loads(out)}
    assert set(items) == {cq("idle"), cq("borrow")}  # topology advice patches nothing
    raw = {o["metadata"]["name"]: o for o in dump_objects() if o["kind"] == "ClusterQueue"}
    for name, item in items.items():
        patched = merge_patch(raw[name], item["patch"])
        assert_valid_kueue(patched)
        assert item["command"].startswith(f"kubectl patch clusterqueue {name} --type=merge -p '")
    idle = merge_patch(raw[cq("idle")], items[cq("idle")]["patch"])
    resources = idle["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
    assert resources[0] == {"name": s.GPU, "nominalQuota": 16, "lendingLimit": 8}
    assert resources[1] == {"name": "cpu", "nominalQuota": "1000"}  # untouched, not dropped
    borrow = merge_patch(raw[cq("borrow")], items[cq("borrow")]["patch"])
    gpu = borrow["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]
    assert (gpu["nominalQuota"], gpu["borrowingLimit"]) == (24, 8)


def quota_ids_file(tmp_path: Path) -> Path:
    path = tmp_path / "ids.yaml"
    path.write_text(
        yaml.safe_dump({t: {"ComputeQuotaId": i, "TargetVersion": 3} for t, i in IDS.items()})
    )
    return path


def test_emit_hyperpod_requests_validate_against_botocore(
    dump: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = quota_ids_file(tmp_path)
    argv = ("quota", "advise", "--from", str(dump), "--emit", "hyperpod", "--quota-ids", str(ids))
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    requests = {r["ComputeQuotaId"]: r for r in json.loads(out)}
    assert set(requests) == {IDS["idle"], IDS["borrow"]}
    for request in requests.values():
        validate_parameters(request, update_input_shape())  # raises when invalid
        assert request["TargetVersion"] == 3
    idle = requests[IDS["idle"]]["ComputeQuotaConfig"]
    assert idle["ComputeQuotaResources"] == [{"InstanceType": FLAVOR, "Accelerators": 16}]
    assert idle["ResourceSharingConfig"]["Strategy"] == "Lend"  # was DontLend (lendingLimit 0)
    borrow = requests[IDS["borrow"]]["ComputeQuotaConfig"]
    assert borrow["ComputeQuotaResources"] == [{"InstanceType": FLAVOR, "Accelerators": 24}]
    assert borrow["ResourceSharingConfig"] == {
        "Strategy": "LendAndBorrow",
        "AbsoluteBorrowLimits": [{"InstanceType": FLAVOR, "Accelerators": 8}],
    }
    code, out, err = run(capsys, "quota", "advise", "--from", str(dump), "--emit", "hyperpod")
    assert code == 0 and json.loads(out) == []
    assert "idle: no HyperPod compute quota id known" in err


# --- --apply ----------------------------------------------------------------------------------


@pytest.fixture
def sagemaker(monkeypatch: pytest.MonkeyPatch) -> Iterator[Stubber]:
    client = botocore.session.get_session().create_client(
        "sagemaker",
        region_name="us-east-2",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    monkeypatch.setattr(quota_cli, "make_sagemaker_client", lambda region: client)
    with Stubber(client) as stubber:
        yield stubber


def quota_arn(quota_id: str) -> str:
    return f"arn:aws:sagemaker:us-east-2:123456789012:compute-quota/{quota_id}"


def summaries() -> dict[str, Any]:
    """ListComputeQuotas' answer: the current configs, which the requests must keep intact."""
    out = []
    for team, quota_id in IDS.items():
        out.append(
            {
                "ComputeQuotaArn": quota_arn(quota_id),
                "ComputeQuotaId": quota_id,
                "Name": f"{team}-quota",
                "ComputeQuotaVersion": 7,
                "Status": "Created",
                "ClusterArn": "arn:aws:sagemaker:us-east-2:123456789012:cluster/abcdefghijkl",
                "ComputeQuotaConfig": {
                    "ComputeQuotaResources": [
                        {"InstanceType": FLAVOR, "Accelerators": 32},
                        {"InstanceType": "ml.g5.8xlarge", "Count": 2},
                    ],
                    "ResourceSharingConfig": {"Strategy": "LendAndBorrow", "BorrowLimit": 50},
                    "PreemptTeamTasks": "LowerPriority",
                },
                "ComputeQuotaTarget": {"TeamName": team, "FairShareWeight": 1},
                "ActivationState": "Enabled",
                "CreationTime": T0,
            }
        )
    return {"ComputeQuotaSummaries": out}


def test_apply_looks_up_ids_and_updates_after_yes(
    dump: Path, sagemaker: Stubber, capsys: pytest.CaptureFixture[str]
) -> None:
    sagemaker.add_response("list_compute_quotas", summaries(), {})
    for quota_id, accelerators in ((IDS["borrow"], 24), (IDS["idle"], 16)):
        expected = {
            "ComputeQuotaId": quota_id,
            "TargetVersion": 7,
            "ComputeQuotaConfig": {
                "ComputeQuotaResources": [
                    {"InstanceType": FLAVOR, "Accelerators": accelerators},
                    {"InstanceType": "ml.g5.8xlarge", "Count": 2},
                ],
                "ResourceSharingConfig": {"Strategy": "LendAndBorrow", "BorrowLimit": 50},
                "PreemptTeamTasks": "LowerPriority",
            },
        }
        if quota_id == IDS["borrow"]:
            sharing = expected["ComputeQuotaConfig"]["ResourceSharingConfig"]
            sharing["AbsoluteBorrowLimits"] = [{"InstanceType": FLAVOR, "Accelerators": 8}]
        arn = quota_arn(quota_id)
        sagemaker.add_response(
            "update_compute_quota",
            {"ComputeQuotaArn": arn, "ComputeQuotaVersion": 8},
            expected,
        )
    code, _, err = run(capsys, "quota", "advise", "--from", str(dump), "--apply", "--yes")
    assert code == 0, err
    sagemaker.assert_no_pending_responses()
    assert f"{IDS['idle']}: updated to version 8" in err


@pytest.mark.parametrize(("answer", "applied"), [("n", False), ("y", True)])
def test_apply_asks_first(
    dump: Path,
    tmp_path: Path,
    sagemaker: Stubber,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    answer: str,
    applied: bool,
) -> None:
    questions: list[str] = []

    def fake_input(question: str) -> str:
        questions.append(question)
        return answer

    monkeypatch.setattr("builtins.input", fake_input)
    if applied:
        for quota_id in (IDS["borrow"], IDS["idle"]):
            arn = quota_arn(quota_id)
            sagemaker.add_response(
                "update_compute_quota", {"ComputeQuotaArn": arn, "ComputeQuotaVersion": 4}
            )
    ids = quota_ids_file(tmp_path)
    code, out, err = run(
        capsys, "quota", "advise", "--from", str(dump), "--apply", "--quota-ids", str(ids)
    )
    assert questions == ["Apply 2 UpdateComputeQuota request(s) shown above? [y/N] "]
    assert len(json.loads(out)) == 2  # shown before the question
    assert code == (0 if applied else 1)
    assert ("not applied" in err) is not applied
    sagemaker.assert_no_pending_responses()  # a "no" makes no call at all


def test_apply_reports_a_failed_update(
    dump: Path, tmp_path: Path, sagemaker: Stubber, capsys: pytest.CaptureFixture[str]
) -> None:
    sagemaker.add_client_error("update_compute_quota", "ConflictException", "version moved on")
    arn = quota_arn(IDS["idle"])
    sagemaker.add_response(
        "update_compute_quota", {"ComputeQuotaArn": arn, "ComputeQuotaVersion": 4}
    )
    ids = quota_ids_file(tmp_path)
    argv = ("quota", "advise", "--from", str(dump), "--apply", "--yes", "--quota-ids", str(ids))
    code, _, err = run(capsys, *argv)
    assert code == 1
    assert "ConflictException" in err and f"{IDS['idle']}: updated to version 4" in err


# --- --server and errors ----------------------------------------------------------------------


@pytest.fixture
def server() -> Iterator[str]:
    recs = [
        Recommendation(cq("idle"), "idle", "nominal", 32, 16, "nominal_idle", "idles", {}, FLAVOR),
        Recommendation(cq("wide"), "wide", "topology_fit", 48, 32, "unplaceable_at_level", "x"),
    ]
    body = json.dumps([*recommendations_view(recs), {"kind": "bogus"}]).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            found = self.path == quota_cli.RECOMMENDATIONS_PATH
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body if found else b"{}")

        def log_message(self, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_advice_from_a_running_service(
    server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "quota", "advise", "--server", server)
    assert code == 0 and "ignored 1 unreadable entries" in err
    assert f"{cq('idle')}  idle  nominal" in out and "unplaceable_at_level" in out
    code, _, err = run(capsys, "quota", "advise", "--server", server, "--emit", "kueue")
    assert code == 1 and "--emit kueue needs --from" in err
    # Without the ClusterQueue or the current HyperPod config, nothing is guessed.
    ids = quota_ids_file(tmp_path)
    argv = ("quota", "advise", "--server", server, "--emit", "hyperpod", "--quota-ids", str(ids))
    code, out, err = run(capsys, *argv)
    assert code == 0 and json.loads(out) == [] and "current compute quota config unknown" in err


def test_errors_are_plain(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "quota", "advise", "--server", "http://127.0.0.1:9")
    assert code == 1 and "cannot reach" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("items: [\n")
    code, _, err = run(capsys, "quota", "advise", "--from", str(bad))
    assert code == 1 and "not valid YAML" in err
    code, _, err = run(capsys, "quota", "advise", "--from", str(tmp_path / "none.yaml"))
    assert code == 1 and "cannot read" in err
    code, _, err = run(capsys, "quota", "advise", "--from", str(bad), "--apply", "--emit", "kueue")
    assert code == 2 and "kubectl" in err
    ids = tmp_path / "ids.yaml"
    ids.write_text("- not a mapping\n")
    empty = tmp_path / "empty.yaml"
    empty.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": []}))
    argv = ("quota", "advise", "--from", str(empty), "--emit", "hyperpod", "--quota-ids", str(ids))
    code, _, err = run(capsys, *argv)
    assert code == 1 and "expected a mapping" in err
    code, out, _ = run(capsys, "quota", "advise", "--from", str(empty))
    assert code == 0 and out == "no quota changes recommended\n"
