"""`topowatch topology from-ec2` / `check`: parsing saved responses, every format, drift."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporter.cli import main
from exporter.topology.drift import compare, parse_topology_conf
from exporter.topology.ec2 import (
    Topology,
    TopologyInputError,
    instances_from_pages,
    load_name_map,
    load_pages,
)
from exporter.topology.hostlist import HostlistError, compress, expand
from exporter.topology.writers import block_rule_violations, slurm_tree
from tests.conftest import reference

FIXTURES = Path(__file__).parents[1] / "fixtures" / "ec2"
P5 = "aws/describe-instance-topology-p5.json"
MIXED = FIXTURES / "depth4-mixed-pages.json"
MIXED_NAMES = FIXTURES / "depth4-mixed-names.json"
GB200 = FIXTURES / "gb200-ultraservers.json"
GB200_NAMES = FIXTURES / "gb200-names.txt"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["topology", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def conf_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


# -- parsing ---------------------------------------------------------------------------------


def test_reference_p5_response_parses_into_depth_3_tree() -> None:
    instances = instances_from_pages(load_pages(reference(P5)))
    assert [i.instance_id for i in instances] == [
        "i-0febfe7a633a552cc",
        "i-0727864293842c5f1",
        "i-04e4ca4199532bbba",
        "i-0359d6503bf895535",
    ]
    first = instances[0]
    assert first.network_nodes == (
        "nn-098f9e7674016cb1c",
        "nn-224a2a4d9df61a975",
        "nn-20da390f7d602f42f",
    )
    assert (first.instance_type, first.availability_zone, first.zone_id) == (
        "p5.48xlarge",
        "us-east-1e",
        "use1-az3",
    )
    assert Topology(instances).depth == 3


def test_list_of_pages_and_concatenated_documents_give_the_same_instances() -> None:
    listed = instances_from_pages(load_pages(MIXED))
    assert len(listed) == 9
    concatenated = instances_from_pages(load_pages(FIXTURES / "concatenated-pages.json"))
    assert [i.instance_id for i in concatenated] == [f"i-0a00000000000000{n}" for n in (1, 2, 3, 4)]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "empty input"),
        ("{not json", "not JSON"),
        ('{"Reservations": 3, "Instances": 5}', "page 1: expected an object with an 'Instances'"),
        ('[{"Instances": []}, 7]', "page 2"),
        ('{"Instances": [{"InstanceType": "p5.48xlarge"}]}', "Instances[0]: missing InstanceId"),
        ('{"Instances": [{"InstanceId": "i-1", "NetworkNodes": "nn-1"}]}', "NetworkNodes must"),
        ('{"Instances": [{"InstanceId": "i-1", "ZoneId": 4}]}', "ZoneId must be a string"),
    ],
)
def test_malformed_input_exits_2_with_a_clear_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    code, out, err = run(capsys, "from-ec2", "--input", str(bad))
    assert code == 2
    assert out == ""
    assert message in err
    assert "Traceback" not in err


def test_missing_input_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "from-ec2", "--input", str(tmp_path / "nope.json"))
    assert code == 2
    assert "cannot read" in err


def test_name_map_text_and_json_forms(tmp_path: Path) -> None:
    assert load_name_map(GB200_NAMES)["i-0d000000000000001"] == "gb200-01"
    assert load_name_map(MIXED_NAMES)["i-0b000000000000004"] == "ip-10-1-3-4"
    bad = tmp_path / "names.txt"
    bad.write_text("i-1 a b\n")
    with pytest.raises(TopologyInputError, match="line 1"):
        load_name_map(bad)


def test_two_instances_mapped_to_one_name_is_an_input_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    names = tmp_path / "names.json"
    names.write_text(json.dumps({"i-0febfe7a633a552cc": "n1", "i-0727864293842c5f1": "n1"}))
    code, _, err = run(capsys, "from-ec2", "--input", str(reference(P5)), "--name-map", str(names))
    assert code == 2
    assert "both map to node name 'n1'" in err


# -- hostlists -------------------------------------------------------------------------------


def test_hostlist_compression_round_trips() -> None:
    names = [f"ip-10-1-2-{n}" for n in (3, 4, 5, 9, 10)] + ["gb200-07", "gb200-08", "login"]
    expression = compress(names)
    assert expression == "gb200-[07-08],ip-10-1-2-[3-5,9-10],login"
    assert sorted(expand(expression)) == sorted(names)
    assert expand("rack[1-2]-n[01-02]") == ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]
    for bad in ("n[1-", "n[3-1]", "n[a]", "n]"):
        with pytest.raises(HostlistError):
            expand(bad)


# -- formats ---------------------------------------------------------------------------------


def test_slurm_tree_of_the_reference_p5_file(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "from-ec2", "--input", str(reference(P5)), "--format", "slurm-tree")
    assert code == 0
    assert conf_lines(out) == [
        "SwitchName=nn-098f9e7674016cb1c Switches=nn-224a2a4d9df61a975",
        "SwitchName=nn-224a2a4d9df61a975 Switches=nn-20da390f7d602f42f,nn-568b52163b3ce19c8,"
        "nn-d7d7a965aec389018,nn-ef5c999131844763a",
        "SwitchName=nn-20da390f7d602f42f Nodes=i-0febfe7a633a552cc",
        "SwitchName=nn-568b52163b3ce19c8 Nodes=i-0727864293842c5f1",
        "SwitchName=nn-d7d7a965aec389018 Nodes=i-04e4ca4199532bbba",
        "SwitchName=nn-ef5c999131844763a Nodes=i-0359d6503bf895535",
    ]


def test_slurm_tree_mixes_depths_compresses_leaves_and_reports_stopped_instances(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(capsys, "from-ec2", "--input", str(MIXED), "--name-map", str(MIXED_NAMES))
    assert code == 0
    lines = conf_lines(out)
    assert "SwitchName=nn-3a000000000000a1 Nodes=ip-10-1-2-[1-2]" in lines  # p5: leaf at layer 3
    assert "SwitchName=nn-4a000000000000b2 Nodes=ip-10-1-3-[3-4]" in lines  # b200: layer 4
    assert "SwitchName=nn-3a0000000000000b1 Switches=nn-4a000000000000b1,nn-4a000000000000b2" in (
        lines
    )
    assert "ip-10-1-9-9" not in out
    assert "ip-10-1-9-9 (i-0c000000000000001): no network nodes" in err


def test_conflicting_parents_are_noted_not_duplicated() -> None:
    pages = [
        {
            "Instances": [
                {"InstanceId": "i-1", "NetworkNodes": ["a", "b", "c"]},
                {"InstanceId": "i-2", "NetworkNodes": ["x", "b", "d"]},
            ]
        }
    ]
    rendered = slurm_tree(Topology(instances_from_pages(pages)))
    assert sum(line.startswith("SwitchName=b ") for line in rendered.text.splitlines()) == 1
    assert any("network node b" in note for note in rendered.notes)


def test_slurm_block_one_block_per_ultraserver_and_rule_violations(
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = ("from-ec2", "--input", str(GB200), "--name-map", str(GB200_NAMES))
    code, out, err = run(capsys, *base, "--format", "slurm-block")
    assert code == 0, err
    assert conf_lines(out) == [
        "BlockName=cr-0a1b2c3d4e5f60001 Nodes=gb200-[01-18]",
        "BlockName=cr-0a1b2c3d4e5f60002 Nodes=gb200-[19-35]",
        "BlockSizes=17",
    ]
    code, out, err = run(capsys, *base, "--format", "slurm-block", "--block-sizes", "18,36")
    assert code == 1
    assert "block cr-0a1b2c3d4e5f60002 has 17 node(s), fewer than the base block size 18" in err


def test_block_size_rules() -> None:
    assert block_rule_violations({"a": 18, "b": 18}, [18, 36, 72]) == []
    assert block_rule_violations({"a": 18}, [18, 54]) == [
        "block size 54 is not 18 times a power of two"
    ]
    assert any("ascend" in p for p in block_rule_violations({"a": 18}, [18, 18]))


def test_slurm_block_without_ultraservers_fails_clearly(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "from-ec2", "--input", str(reference(P5)), "--format", "slurm-block")
    assert code == 1
    assert "no instance has a CapacityBlockId" in err


def test_k8s_labels_as_json_patch_and_kubectl(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "from-ec2", "--input", str(GB200), "--name-map", str(GB200_NAMES),
        "--format", "k8s-labels",
    )  # fmt: skip
    assert code == 0
    nodes = {entry["node"]: entry for entry in json.loads(out)["nodes"]}
    assert len(nodes) == 35
    first = nodes["gb200-01"]
    assert {op["path"]: op["value"] for op in first["patch"]} == {
        "/metadata/labels/topology.k8s.aws~1network-node-layer-1": "nn-1d0000000000000d1",
        "/metadata/labels/topology.k8s.aws~1network-node-layer-2": "nn-2d000000000000001",
        "/metadata/labels/topology.k8s.aws~1network-node-layer-3": "nn-3d00000000000010",
        "/metadata/labels/topology.k8s.aws~1network-node-layer-4": "nn-4d0000000000010",
        "/metadata/labels/topology.k8s.aws~1ultraserver-id": "cr-0a1b2c3d4e5f60001",
    }
    assert all(op["op"] == "add" for op in first["patch"])
    assert first["kubectl"].startswith("kubectl label node gb200-01 --overwrite ")
    assert "topology.k8s.aws/ultraserver-id=cr-0a1b2c3d4e5f60001" in first["kubectl"]


def test_mermaid_links_layer_1_down_to_instances(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "from-ec2", "--input", str(reference(P5)), "--format", "mermaid")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "flowchart TD"
    ids = {}
    for line in lines[1:]:
        if "[" in line or "(" in line:
            node_id, _, label = line.strip().partition("[" if "[" in line else "(")
            ids[label.strip('[]()"').split("<br/>")[0]] = node_id
    edges = {tuple(line.split(" --> ")) for line in (ln.strip() for ln in lines) if "-->" in line}
    assert (ids["nn-098f9e7674016cb1c"], ids["nn-224a2a4d9df61a975"]) in edges
    assert (ids["nn-224a2a4d9df61a975"], ids["nn-20da390f7d602f42f"]) in edges
    assert (ids["nn-20da390f7d602f42f"], ids["i-0febfe7a633a552cc"]) in edges
    assert len(edges) == 1 + 4 + 4


def test_json_is_the_normalized_tree(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "from-ec2",
        "--input",
        str(MIXED),
        "--name-map",
        str(MIXED_NAMES),
        "--format",
        "json",
    )
    assert code == 0
    document = json.loads(out)
    assert document["layers"] == 4
    (top,) = document["tree"]
    assert top["id"] == "nn-1a0000000000000a1"
    b200 = next(s for s in top["switches"] if s["id"] == "nn-2a0000000000000b1")
    assert b200["switches"][0]["switches"][1]["nodes"] == ["ip-10-1-3-3", "ip-10-1-3-4"]
    stopped = next(i for i in document["instances"] if i["instance_id"] == "i-0c000000000000001")
    assert stopped["network_nodes"] == []
    assert stopped["availability_zone"] == "us-east-1e"


# -- drift -----------------------------------------------------------------------------------


def _mixed_topology() -> Topology:
    return Topology(instances_from_pages(load_pages(MIXED)), load_name_map(MIXED_NAMES))


def test_generated_conf_has_no_drift(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    conf = tmp_path / "topology.conf"
    conf.write_text(slurm_tree(_mixed_topology()).text)
    args = ("check", "--slurm", str(conf), "--input", str(MIXED), "--name-map", str(MIXED_NAMES))
    code, out, _ = run(capsys, *args)
    assert code == 0
    assert "topology.conf matches EC2" in out
    assert "ip-10-1-9-9" not in out  # stopped and not in the conf: nothing to say


def test_drift_reports_missing_moved_and_stale(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = tmp_path / "topology.conf"
    conf.write_text(
        "# hand-edited\n"
        "SwitchName=nn-1a0000000000000a1 Switches=nn-2a0000000000000a1\n"
        "SwitchName=nn-2a0000000000000a1 Switches=nn-3a000000000000a[1-2]\n"
        "switchname=nn-3a000000000000a1 nodes=ip-10-1-2-[1-3]\n"  # 3 belongs under a2
        "SwitchName=nn-3a000000000000a2 Nodes=ip-10-1-2-4,ip-10-1-7-1\n"  # 10-1-7-1 is gone
    )
    args = ("check", "--slurm", str(conf), "--input", str(MIXED), "--name-map", str(MIXED_NAMES))
    code, out, _ = run(capsys, *args)
    assert code == 1
    assert "moved:   ip-10-1-2-3 is under nn-3a000000000000a1 in topology.conf;" in out
    assert "EC2 says nn-3a000000000000a2" in out
    assert "stale:   ip-10-1-7-1" in out
    for node in ("ip-10-1-3-1", "ip-10-1-3-2", "ip-10-1-3-3", "ip-10-1-3-4"):
        assert f"missing: {node} is not in topology.conf" in out
    assert "drift: 4 missing, 1 moved, 1 stale" in out


def test_drift_of_parsed_conf_is_structured() -> None:
    conf = parse_topology_conf("SwitchName=s1 Nodes=ip-10-1-2-[1-4]\n")
    drift = compare(conf, _mixed_topology())
    assert [node for node, _ in drift.missing] == [f"ip-10-1-3-{n}" for n in (1, 2, 3, 4)]
    assert [node for node, _, _ in drift.moved] == [f"ip-10-1-2-{n}" for n in (1, 2, 3, 4)]
    assert drift.stale == ()
    assert not drift.clean


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("SwitchName=s1 Nodes=n[1-\n", "line 1: unclosed"),
        ("Nodes=n1\n", "line 1: no SwitchName"),
        ("SwitchName=s1 Nodes=n1\nSwitchName=s1 Nodes=n2\n", "line 2: switch s1 defined twice"),
        ("BlockName=b1 Nodes=n1\n", "topology/block"),
        ("SwitchName=s1 garbage\n", "expected KEY=VALUE"),
    ],
)
def test_bad_topology_conf_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    conf = tmp_path / "topology.conf"
    conf.write_text(content)
    code, _, err = run(capsys, "check", "--slurm", str(conf), "--input", str(reference(P5)))
    assert code == 2
    assert message in err


# -- live calls: botocore Stubber on real clients (requests validated against the models) -------


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
        "AWS_EC2_METADATA_DISABLED": "true",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


def _ec2_instance(index: int) -> dict[str, object]:
    return {
        "InstanceId": f"i-{index:017x}",
        "InstanceType": "p5.48xlarge",
        "NetworkNodes": ["nn-top", f"nn-mid{index % 2}", f"nn-leaf{index % 4}"],
        "AvailabilityZone": "us-east-1e",
        "ZoneId": "use1-az3",
    }


def test_describe_instance_topology_batches_ids_and_follows_pages(aws_env: None) -> None:
    from botocore.stub import Stubber

    from exporter.sources import aws

    client = aws.ec2_client("us-east-1")
    ids = [f"i-{n:017x}" for n in range(1, 251)]  # 250 ids: calls of 100, 100, 50
    stub = Stubber(client)
    stub.add_response(
        "describe_instance_topology",
        {"Instances": [_ec2_instance(n) for n in range(1, 61)], "NextToken": "more"},
        {"InstanceIds": ids[:100]},
    )
    stub.add_response(
        "describe_instance_topology",
        {"Instances": [_ec2_instance(n) for n in range(61, 101)]},
        {"InstanceIds": ids[:100], "NextToken": "more"},
    )
    stub.add_response(
        "describe_instance_topology",
        {"Instances": [_ec2_instance(n) for n in range(101, 201)]},
        {"InstanceIds": ids[100:200]},
    )
    stub.add_response(
        "describe_instance_topology",
        {"Instances": [_ec2_instance(n) for n in range(201, 251)]},
        {"InstanceIds": ids[200:]},
    )
    with stub:
        pages = aws.describe_instance_topology(client, ids)
    stub.assert_no_pending_responses()
    instances = instances_from_pages(pages)
    assert [i.instance_id for i in instances] == ids
    assert instances[4].network_nodes == ("nn-top", "nn-mid1", "nn-leaf1")


def test_describe_all_instances_pages_with_max_results(aws_env: None) -> None:
    from botocore.stub import Stubber

    from exporter.sources import aws

    client = aws.ec2_client("us-east-1")
    stub = Stubber(client)
    stub.add_response(
        "describe_instance_topology",
        {"Instances": [_ec2_instance(1)], "NextToken": "t2"},
        {"MaxResults": 100, "GroupNames": ["pg-a"]},
    )
    stub.add_response(
        "describe_instance_topology",
        {"Instances": [_ec2_instance(2)]},
        {"MaxResults": 100, "GroupNames": ["pg-a"], "NextToken": "t2"},
    )
    with stub:
        pages = aws.describe_instance_topology(client, group_names=["pg-a"])
    assert len(instances_from_pages(pages)) == 2


def test_hyperpod_nodes_pages_and_names_from_describe(aws_env: None) -> None:
    from botocore.stub import Stubber

    from exporter.sources import aws

    client = aws.sagemaker_client("us-east-1")
    stub = Stubber(client)
    launch = "2025-01-01T00:00:00Z"

    def summary(index: int, hostname: str | None = None) -> dict[str, object]:
        item: dict[str, object] = {
            "InstanceGroupName": "workers",
            "InstanceId": f"i-{index:017x}",
            "InstanceType": "ml.p5.48xlarge",
            "LaunchTime": launch,
            "InstanceStatus": {"Status": "Running"},
        }
        if hostname:
            item["PrivateDnsHostname"] = hostname
        return item

    stub.add_response(
        "list_cluster_nodes",
        {"ClusterNodeSummaries": [summary(1, "ip-10-1-2-3.ec2.internal"), summary(2)],
         "NextToken": "p2"},
        {"ClusterName": "hp", "MaxResults": 100},
    )  # fmt: skip
    stub.add_response(
        "describe_cluster_node",
        {"NodeDetails": {"InstanceId": f"i-{2:017x}",
                         "PrivateDnsHostname": "ip-10-1-2-4.ec2.internal"}},
        {"ClusterName": "hp", "NodeId": f"i-{2:017x}"},
    )  # fmt: skip
    stub.add_response(
        "list_cluster_nodes",
        {"ClusterNodeSummaries": [summary(3)]},
        {"ClusterName": "hp", "MaxResults": 100, "NextToken": "p2"},
    )
    stub.add_response(
        "describe_cluster_node",
        {"NodeDetails": {"InstanceId": f"i-{3:017x}", "PrivatePrimaryIp": "10.1.2.5"}},
        {"ClusterName": "hp", "NodeId": f"i-{3:017x}"},
    )
    with stub:
        nodes = aws.hyperpod_nodes(client, "hp")
    stub.assert_no_pending_responses()
    assert [(n.instance_id, n.name) for n in nodes] == [
        (f"i-{1:017x}", "ip-10-1-2-3"),
        (f"i-{2:017x}", "ip-10-1-2-4"),
        (f"i-{3:017x}", "ip-10-1-2-5"),
    ]


def test_cli_cluster_source_names_slurm_nodes_like_hyperpod(
    aws_env: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import boto3
    from botocore.stub import Stubber

    from exporter.sources import aws

    ec2 = boto3.client("ec2", region_name="us-east-1")
    sagemaker = boto3.client("sagemaker", region_name="us-east-1")
    ids = [f"i-{n:017x}" for n in (1, 2)]
    sm_stub, ec2_stub = Stubber(sagemaker), Stubber(ec2)
    sm_stub.add_response(
        "list_cluster_nodes",
        {"ClusterNodeSummaries": [
            {"InstanceGroupName": "w", "InstanceId": i, "InstanceType": "ml.p5.48xlarge",
             "LaunchTime": "2025-01-01T00:00:00Z", "InstanceStatus": {"Status": "Running"},
             "PrivateDnsHostname": f"ip-10-1-2-{n}.ec2.internal"}
            for n, i in enumerate(ids, start=3)
        ]},
        {"ClusterName": "hp", "MaxResults": 100},
    )  # fmt: skip
    ec2_stub.add_response(
        "describe_instance_topology",
        {"Instances": [_ec2_instance(1), _ec2_instance(2)]},
        {"InstanceIds": ids},
    )
    monkeypatch.setattr(aws, "ec2_client", lambda region=None, profile=None: ec2)
    monkeypatch.setattr(aws, "sagemaker_client", lambda region=None, profile=None: sagemaker)
    with sm_stub, ec2_stub:
        code, out, err = run(capsys, "from-ec2", "--cluster", "hp", "--names", "hyperpod")
    assert code == 0, err
    assert "SwitchName=nn-leaf1 Nodes=ip-10-1-2-3" in out
    assert "SwitchName=nn-leaf2 Nodes=ip-10-1-2-4" in out


def test_cli_reports_aws_errors_without_traceback(
    aws_env: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import boto3
    from botocore.stub import Stubber

    from exporter.sources import aws

    ec2 = boto3.client("ec2", region_name="us-east-1")
    stub = Stubber(ec2)
    stub.add_client_error("describe_instance_topology", "UnauthorizedOperation", "not allowed")
    monkeypatch.setattr(aws, "ec2_client", lambda region=None, profile=None: ec2)
    with stub:
        code, _, err = run(capsys, "from-ec2", "--instance-ids", "i-00000000000000001")
    assert code == 2
    assert "AWS call failed" in err and "UnauthorizedOperation" in err
    assert "Traceback" not in err


# -- throttling: the Stubber bypasses botocore's retry layer, so a loopback endpoint throttles ---


_EC2_NS = "http://ec2.amazonaws.com/doc/2016-11-15/"
_THROTTLED = (
    "<?xml version='1.0' encoding='UTF-8'?><Response><Errors><Error>"
    "<Code>RequestLimitExceeded</Code><Message>Request limit exceeded.</Message>"
    "</Error></Errors><RequestID>r1</RequestID></Response>"
)
_TOPOLOGY = (
    f"<?xml version='1.0' encoding='UTF-8'?><DescribeInstanceTopologyResponse xmlns='{_EC2_NS}'>"
    "<requestId>r2</requestId><instanceSet><item><instanceId>i-00000000000000001</instanceId>"
    "<instanceType>p5.48xlarge</instanceType><networkNodeSet><item>nn-a</item><item>nn-b</item>"
    "<item>nn-c</item></networkNodeSet><availabilityZone>us-east-1e</availabilityZone>"
    "<zoneId>use1-az3</zoneId></item></instanceSet></DescribeInstanceTopologyResponse>"
)


def test_throttling_is_retried_by_botocore(aws_env: None) -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import boto3

    from exporter.sources import aws

    requests: list[bytes] = []

    class FakeEc2(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            requests.append(self.rfile.read(int(self.headers["Content-Length"])))
            throttled = len(requests) == 1
            body = (_THROTTLED if throttled else _TOPOLOGY).encode()
            self.send_response(503 if throttled else 200)
            self.send_header("Content-Type", "text/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeEc2)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        client = boto3.client(
            "ec2",
            region_name="us-east-1",
            endpoint_url=f"http://127.0.0.1:{server.server_address[1]}",
            config=aws.retry_config(attempts=3),
        )
        pages = aws.describe_instance_topology(client, ["i-00000000000000001"])
    finally:
        server.shutdown()
        server.server_close()
    assert len(requests) == 2
    assert b"Action=DescribeInstanceTopology" in requests[0]
    assert instances_from_pages(pages)[0].network_nodes == ("nn-a", "nn-b", "nn-c")
