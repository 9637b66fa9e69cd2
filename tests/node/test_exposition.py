"""The encoders produce what Prometheus and OpenMetrics parsers accept, escaped correctly."""

from __future__ import annotations

import gzip

from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
from prometheus_client.parser import text_string_to_metric_families as parse_text

from exporter.core.exposition import (
    COUNTER,
    GAUGE,
    HISTOGRAM,
    INFO,
    UNTYPED,
    Exposition,
    Family,
    encode_openmetrics,
    encode_text,
    format_value,
    wants_openmetrics,
)


def families() -> list[Family]:
    up = Family("topowatch_gpu_up", GAUGE, "1 when the GPU answered.")
    up.add([("node", "n1"), ("gpu", "0")], True)
    up.add([("node", "n1"), ("gpu", "1")], False)
    energy = Family("topowatch_gpu_energy_joules", COUNTER, "Energy.")
    energy.add([("node", "n1"), ("gpu", "0")], 1234.5)
    topo = Family("topowatch_node_topology", INFO, "Topology.")
    topo.add([("node", "n1"), ("layer1", 'we"ird\\va\nlue')], 1)
    peer = Family("node_amazonefa_tx_bytes", UNTYPED, "Peer counter.")
    peer.add([("device", "rdmap16s27"), ("port", "1")], 10)
    empty = Family("topowatch_never_set", GAUGE, "No samples: must not appear.")
    return [up, energy, topo, peer, empty]


def test_text_format_parses_and_keeps_values_and_escapes() -> None:
    text = encode_text(families()).decode()
    parsed = {f.name: f for f in parse_text(text)}
    assert "topowatch_never_set" not in text
    assert [s.value for s in parsed["topowatch_gpu_up"].samples] == [1.0, 0.0]
    energy = parsed["topowatch_gpu_energy_joules"]
    assert energy.type == "counter"
    assert energy.samples[0].name == "topowatch_gpu_energy_joules_total"
    assert energy.samples[0].value == 1234.5
    info_sample = parsed["topowatch_node_topology_info"].samples[0]
    assert info_sample.labels["layer1"] == 'we"ird\\va\nlue'


def test_openmetrics_format_parses_with_types_and_eof() -> None:
    body = encode_openmetrics(families()).decode()
    assert body.endswith("# EOF\n")
    parsed = {f.name: f for f in parse_om(body)}
    assert parsed["topowatch_gpu_energy_joules"].type == "counter"
    assert (
        parsed["topowatch_gpu_energy_joules"].samples[0].name == "topowatch_gpu_energy_joules_total"
    )
    assert parsed["topowatch_node_topology"].type == "info"
    assert parsed["topowatch_node_topology"].samples[0].labels["layer1"] == 'we"ird\\va\nlue'
    assert parsed["node_amazonefa_tx_bytes"].type == "unknown"


def histogram() -> Family:
    wait = Family("topowatch_wait_seconds", HISTOGRAM, "Wait.")
    wait.add_histogram([("cluster_queue", "a")], [(1, 2), (5.5, 3)], total=12.5, count=4)
    return wait


def test_histograms_parse_in_both_formats_with_cumulative_buckets() -> None:
    for parse, body in (
        (parse_text, encode_text([histogram()]).decode()),
        (parse_om, encode_openmetrics([histogram()]).decode()),
    ):
        (fam,) = list(parse(body))
        assert fam.type == "histogram"
        by_le = {s.labels.get("le"): s.value for s in fam.samples if s.name.endswith("_bucket")}
        assert by_le == {"1.0": 2, "5.5": 3, "+Inf": 4}
        total = {s.name: s.value for s in fam.samples if not s.name.endswith("_bucket")}
        assert total == {"topowatch_wait_seconds_sum": 12.5, "topowatch_wait_seconds_count": 4}


def test_value_formatting() -> None:
    assert format_value(True) == "1"
    assert format_value(3) == "3"
    assert format_value(2.0) == "2"
    assert format_value(0.25) == "0.25"
    assert format_value(float("nan")) == "NaN"
    assert format_value(float("-inf")) == "-Inf"
    assert format_value(18446744073709551615) == "18446744073709551615"  # u64 counters stay exact


def test_content_negotiation_follows_prometheus_accept_header() -> None:
    prometheus_accept = (
        "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
        "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
    )
    assert wants_openmetrics(prometheus_accept)
    assert not wants_openmetrics("text/plain;version=0.0.4")
    assert not wants_openmetrics(None)
    assert not wants_openmetrics("*/*")


def test_gzip_body_is_computed_once_and_round_trips() -> None:
    exp = Exposition.build(families())
    packed = exp.body(openmetrics=False, use_gzip=True)
    assert gzip.decompress(packed) == exp.text
    assert exp.body(openmetrics=False, use_gzip=True) is packed
    assert gzip.decompress(exp.body(openmetrics=True, use_gzip=True)) == exp.openmetrics
