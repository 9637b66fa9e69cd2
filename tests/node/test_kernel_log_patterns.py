"""The kernel log pattern table recognises real driver and kernel lines, and only those.

Each scenario is a line in the format its driver or kernel prints (the citation says where the
format string is), with what the node agent must learn from it: the kind of fault, its
severity, the XID/SXid code, the PCI address in sysfs form, and the device it names.
"""

from __future__ import annotations

import csv
import re
from importlib import resources
from pathlib import Path

import pytest

from exporter.node.kernel.patterns import (
    GROUPS,
    KINDS,
    SEVERITIES,
    LogMatch,
    match_line,
    nvrm_pci_to_sysfs,
    patterns,
    record_may_match,
)

OGKM = "NVIDIA/open-gpu-kernel-modules 595.45.04"
KERNEL_RC = f"{OGKM} src/nvidia/src/kernel/gpu/rc/kernel_rc.c XID_PRINT_WITH_ATTR"
NVSWITCH = f"{OGKM} src/common/nvswitch/kernel/inc/common_nvswitch.h NVSWITCH_PRINT_SXID"
EFA_COM = "torvalds/linux drivers/infiniband/hw/efa/efa_com.c"
EFA_MAIN = "torvalds/linux drivers/infiniband/hw/efa/efa_main.c"
NVS_EFA = "NVIDIA/NVSentinel health-monitors/syslog-health-monitor/pkg/nicdriver/efa_test.go"
AER = "torvalds/linux drivers/pci/pcie/aer.c"

# (line, expected match, where the format comes from)
SCENARIOS: list[tuple[str, LogMatch, str]] = [
    (
        "NVRM: Xid (PCI:0000:53:00): 79, pid=1234, name=python3, GPU has fallen off the bus.",
        LogMatch("xid", "xid", "error", code=79, pci_address="0000:53:00.0"),
        f"{KERNEL_RC} with process; XID 79 stays an XID (dedup with NVML)",
    ),
    (
        "NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, "
        "Graphics SM Warp Exception on (GPC 7, TPC 1, SM 0): Out Of Range Address",
        LogMatch("xid", "xid", "error", code=13, pci_address="0000:cb:00.0"),
        f"{KERNEL_RC}; line from leptonai/gpud docs (accelerator-nvidia-error-xid)",
    ),
    (
        "NVRM: Xid (PCI:0000:01:00): 94, pid=7062, Contained: CE User Channel (0x9). "
        "RST: No, D-RST: No",
        LogMatch("xid", "xid", "error", code=94, pci_address="0000:01:00.0"),
        f"{OGKM} src/nvidia/src/kernel/gpu/arch/ampere/kern_gpu_error_cont_ga100.c comment",
    ),
    (
        "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). "
        "RST: No, D-RST: No",
        LogMatch("xid", "xid", "error", code=94, pci_address="0000:01:00.0"),
        f"{OGKM} kern_gpu_error_cont_ga100.c comment (MIG GPU instance attribution)",
    ),
    (
        "NVRM: Xid (PCI:0000:B9:00 GPU-I:01 GPU-CI:00): 43, pid=88, name=train, Ch 00000008",
        LogMatch("xid", "xid", "error", code=43, pci_address="0000:b9:00.0"),
        f"{KERNEL_RC} 'PCI:%04x:%02x:%02x GPU-I:%02u GPU-CI:%02u' (upper-case hex tolerated)",
    ),
    (
        "NVRM: Xid (PCI:0003:00:00): 74, pid='<unknown>', name=<unknown>, "
        "NVLink: fatal error detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
        LogMatch("xid", "xid", "error", code=74, pci_address="0003:00:00.0", device="link 14"),
        "NVIDIA/NVSentinel docs XID 74 message format; an NVLink XID is an XID naming its link",
    ),
    (
        "NVRM: Xid (PCI:0000:b9:00): 71, NVLink: fatal error detected on link 6",
        LogMatch("xid", "xid", "error", code=71, pci_address="0000:b9:00.0", device="link 6"),
        "SageMaker HyperPod HMA doc sample (../shared/reference/hyperpod, section 2.2)",
    ),
    (
        "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 30 sourcetrack timeout "
        "error",
        LogMatch(
            "sxid",
            "sxid",
            "fatal",
            code=24007,
            pci_address="0000:c3:00.0",
            device="nvidia-nvswitch0",
        ),
        f"{NVSWITCH} + intr_nvswitch.h 'Fatal, Link %02d %s%s'",
    ),
    (
        "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress "
        "non-posted PRIV error (First)",
        LogMatch(
            "sxid",
            "sxid",
            "warning",
            code=12028,
            pci_address="0000:05:00.0",
            device="nvidia-nvswitch3",
        ),
        f"{NVSWITCH} + intr_nvswitch.h 'Non-fatal, Link %02d %s%s'",
    ),
    (
        "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20009, Correctable, Link 04 RX Short Error "
        "Rate",
        LogMatch(
            "sxid",
            "sxid",
            "corrected",
            code=20009,
            pci_address="0000:06:00.0",
            device="nvidia-nvswitch1",
        ),
        f"{NVSWITCH} + error_nvswitch.h 'Correctable, Link %02d '",
    ),
    (
        "nvidia-nvswitch2: SXid (PCI:0000:0b:00.0): 01002, SOE reset timeout error(0)",
        LogMatch(
            "sxid",
            "sxid",
            "error",
            code=1002,
            pci_address="0000:0b:00.0",
            device="nvidia-nvswitch2",
        ),
        f"{NVSWITCH} '%05d' + {OGKM} src/common/nvswitch/kernel/lr10/soe_lr10.c (no severity)",
    ),
    (
        "NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.",
        LogMatch("gpu_fallen_off_bus", "gpu_fallen_off_bus", "fatal", pci_address="0000:91:00.0"),
        f"{OGKM} src/nvidia/arch/nvalloc/unix/src/osinit.c NV_DEV_PRINTF",
    ),
    (
        "NVRM: The NVIDIA GPU 0000:b3:00.0\\x0aNVRM: (PCI ID: 10de:26b5) installed in this "
        "system has\\x0aNVRM: fallen off the bus and is not responding to commands.",
        LogMatch(
            "gpu_fallen_off_bus",
            "gpu_fallen_off_bus_at_probe",
            "fatal",
            pci_address="0000:b3:00.0",
        ),
        f"{OGKM} src/nvidia/arch/nvalloc/unix/src/osapi.c, as /dev/kmsg escapes the newlines",
    ),
    (
        "NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: (PCI ID: 10de:26b5) installed in this "
        "system has\nNVRM: fallen off the bus and is not responding to commands.",
        LogMatch(
            "gpu_fallen_off_bus",
            "gpu_fallen_off_bus_at_probe",
            "fatal",
            pci_address="0000:b3:00.0",
        ),
        "NVIDIA/NVSentinel pkg/gpufallen/types.go: one journal entry with inner newlines",
    ),
    (
        "NVRM: fallen off the bus and is not responding to commands.",
        LogMatch("gpu_fallen_off_bus", "gpu_fallen_off_bus_at_probe", "fatal"),
        f"{OGKM} osapi.c last line alone (a reader that split the record): no address",
    ),
    (
        "efa 0000:10:1b.0 rdmap16s27: The device didn't send any completion for admin cmd "
        "CREATE_QP(6) status 1 (ctx 0x000000001d2f9d31, sq producer: 12, sq consumer: 11, "
        "cq consumer: 11)",
        LogMatch(
            "efa_driver",
            "efa_admin_cmd_timeout",
            "error",
            pci_address="0000:10:1b.0",
            device="rdmap16s27",
        ),
        f"{EFA_COM} efa_com_wait_and_process_admin_cq_interrupts via __ibdev_printk",
    ),
    (
        "infiniband rdmap0s6: Wait for completion (polling) timeout",
        LogMatch("efa_driver", "efa_admin_cmd_timeout", "error", device="rdmap0s6"),
        f"{EFA_COM} polling timeout; {NVS_EFA} prefix",
    ),
    (
        "efa 0000:00:06.0 efa_0: Admin queue is closed",
        LogMatch(
            "efa_driver",
            "efa_admin_queue_closed",
            "error",
            pci_address="0000:00:06.0",
            device="efa_0",
        ),
        f"{EFA_COM} efa_com_submit_admin_cmd",
    ),
    (
        "infiniband rdmap0s6: Failed to process command CREATE_QP (opcode 6) comp_status 1 err -22",
        LogMatch("efa_driver", "efa_admin_cmd_failed", "error", device="rdmap0s6"),
        f"{EFA_COM} efa_com_cmd_exec; {NVS_EFA}",
    ),
    (
        "efa 0000:00:06.0: Reset indication didn't turn off",
        LogMatch(
            "efa_driver",
            "efa_device_reset_failed",
            "fatal",
            pci_address="0000:00:06.0",
        ),
        f"{EFA_COM} efa_com_dev_reset; {NVS_EFA}",
    ),
    (
        "efa 0000:00:06.0: EFA device init failed",
        LogMatch("efa_driver", "efa_device_init_failed", "error", pci_address="0000:00:06.0"),
        f"{EFA_MAIN} efa_probe_device dev_err",
    ),
    (
        "efa 0000:00:06.0: Failed to enable MSI-X. irq_num -28",
        LogMatch("efa_driver", "efa_device_init_failed", "error", pci_address="0000:00:06.0"),
        f"{EFA_MAIN} efa_enable_msix dev_err",
    ),
    (
        "pcieport 0000:00:01.0: AER: Corrected error message received from 0000:01:00.0",
        LogMatch(
            "pcie_aer",
            "aer_error_message_received",
            "corrected",
            pci_address="0000:01:00.0",
            device="0000:00:01.0",
        ),
        f"{AER} aer_print_source (newer kernels; see the row's source)",
    ),
    (
        "pcieport 0000:00:1c.0: AER: Multiple Uncorrectable (Non-Fatal) error message received "
        "from 0000:73:00.1",
        LogMatch(
            "pcie_aer",
            "aer_error_message_received",
            "error",
            pci_address="0000:73:00.1",
            device="0000:00:1c.0",
        ),
        "real log line on a public troubleshooting page (cited in the row's source)",
    ),
    (
        "pcieport 0000:00:03.0: AER: Uncorrected (Fatal) error received: 0000:05:00.0",
        LogMatch(
            "pcie_aer",
            "aer_error_received",
            "fatal",
            pci_address="0000:05:00.0",
            device="0000:00:03.0",
        ),
        f"{AER} aer_print_port_info '%s%s error received: %04x:%02x:%02x.%d' (older kernels)",
    ),
    (
        "pcieport 0000:00:1c.5: AER: Corrected error received: 0000:00:1c.5",
        LogMatch(
            "pcie_aer",
            "aer_error_received",
            "corrected",
            pci_address="0000:00:1c.5",
            device="0000:00:1c.5",
        ),
        f"{AER} aer_print_port_info, the root port reporting itself",
    ),
    (
        "nvidia 0000:53:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, "
        "(Receiver ID)",
        LogMatch(
            "pcie_aer",
            "aer_pcie_bus_error",
            "corrected",
            pci_address="0000:53:00.0",
            device="nvidia",
        ),
        f"{AER} aer_print_error 'PCIe Bus Error: severity=%s, type=%s, (%s)' (older, no 'AER: ')",
    ),
    (
        "nvidia 0000:53:00.0: AER: PCIe Bus Error: severity=Uncorrectable (Non-Fatal), "
        "type=Transaction Layer, (Requester ID)",
        LogMatch(
            "pcie_aer",
            "aer_pcie_bus_error",
            "error",
            pci_address="0000:53:00.0",
            device="nvidia",
        ),
        f"{AER} aer_print_error with dev_fmt 'AER: ' and the 'Uncorrectable' strings",
    ),
    (
        "pcieport 0000:00:01.0: PCIe Bus Error: severity=Uncorrected (Fatal), "
        "type=Inaccessible, (Unregistered Agent ID)",
        LogMatch(
            "pcie_aer",
            "aer_pcie_bus_error",
            "fatal",
            pci_address="0000:00:01.0",
            device="pcieport",
        ),
        f"{AER} aer_print_error, status unreadable",
    ),
    (
        "NVRM: NVLink: fatal error detected on link 6",
        LogMatch("nvlink", "nvlink_error_detected", "fatal", device="link 6"),
        "the row's source: the NVLink text without an Xid header (unconfirmed as its own line)",
    ),
    (
        "INFO: task python3:1234 blocked for more than 122 seconds.",
        LogMatch("hung_task", "hung_task", "warning", device="python3:1234"),
        "torvalds/linux kernel/hung_task.c check_hung_task",
    ),
    (
        "INFO: task kworker/u16:2:98 blocked for more than 245 seconds.",
        LogMatch("hung_task", "hung_task", "warning", device="kworker/u16:2:98"),
        "kernel/hung_task.c: a comm with a colon keeps its pid",
    ),
    (
        "NVRM: Xid (PCI:0000:53:00): 46",
        LogMatch("xid", "xid", "error", code=46, pci_address="0000:53:00.0"),
        f"{KERNEL_RC}: the bare form, the record cut after the code (issue 28: missed before;"
        " kernel-open/nvidia/os-interface.c nv_printf prints in KERN_CONT pieces)",
    ),
    (
        "NVRM: Xid (PCI:0000:53:00): 46 ",
        LogMatch("xid", "xid", "error", code=46, pci_address="0000:53:00.0"),
        "the bare form with the trailing blank a cut record can keep",
    ),
    (
        "NVRM: Xid (PCI:0000:53:00): 154, GPU recovery action changed from 0x0 (None) to 0x1"
        " (GPU Reset Required)",
        LogMatch("xid", "xid", "error", code=154, pci_address="0000:53:00.0"),
        f"{OGKM} src/nvidia/src/kernel/gpu/gpu.c gpuRefreshRecoveryAction: nvErrorLog_va(pGpu,"
        " GPU_RECOVERY_ACTION_CHANGED, 'GPU recovery action changed from 0x%x (%s) to 0x%x (%s)')"
        " through XID_PRINT_WITH_ATTR without a process",
    ),
    (
        "NVRM: nvGpuOpsReportFatalError: uvm encountered global fatal error 0x60, requiring os"
        " reboot to recover.",
        LogMatch("uvm_fatal", "uvm_fatal_error", "fatal"),
        f"{OGKM} src/nvidia/src/kernel/rmapi/nv_gpu_ops.c nvGpuOpsReportFatalError: NV_PRINTF("
        "LEVEL_ERROR, 'uvm encountered global fatal error 0x%x, requiring os reboot to recover.')",
    ),
    (
        "NVRM: GPU 0000:53:00.0: RmInitAdapter failed! (0x22:0x56:667)",
        LogMatch("gpu_init_failed", "rm_init_adapter_failed", "fatal", pci_address="0000:53:00.0"),
        f"{OGKM} src/nvidia/arch/nvalloc/unix/src/osinit.c RmInitAdapter: NV_DEV_PRINTF("
        "NV_DBG_ERRORS, nv, 'RmInitAdapter failed! (0x%x:0x%x:%d)') with NV_DEV_PRINTF's"
        " 'NVRM: GPU %04x:%02x:%02x.%x: ' (kernel-open/common/inc/os-interface.h)",
    ),
    (
        "NVRM: RmInitAdapter failed! (0x26:0xffff:1239)",
        LogMatch("gpu_init_failed", "rm_init_adapter_failed", "fatal"),
        "older drivers: the same message without NV_DEV_PRINTF's GPU prefix (names no GPU)",
    ),
    (
        "net_ratelimit: 37 callbacks suppressed",
        LogMatch(
            "printk_suppressed",
            "printk_callbacks_suppressed",
            "warning",
            code=37,
            device="net_ratelimit",
        ),
        "torvalds/linux lib/ratelimit.c ___ratelimit: printk_deferred(KERN_WARNING"
        " '%s: %d callbacks suppressed', func, missed); func is net_ratelimit's here",
    ),
    (
        "efa_com_wait_and_process_admin_cq_interrupts: 5 callbacks suppressed",
        LogMatch(
            "printk_suppressed",
            "printk_callbacks_suppressed",
            "warning",
            code=5,
            device="efa_com_wait_and_process_admin_cq_interrupts",
        ),
        f"lib/ratelimit.c for {EFA_COM}'s ibdev_err_ratelimited (the admin command timeouts)",
    ),
]


@pytest.mark.parametrize(
    ("line", "expected"),
    [(line, expected) for line, expected, _ in SCENARIOS],
    ids=[f"{expected.pattern}-{i}" for i, (_, expected, _) in enumerate(SCENARIOS)],
)
def test_real_lines_are_recognised(line: str, expected: LogMatch) -> None:
    assert match_line(line) == expected


def test_every_pattern_has_a_scenario() -> None:
    """A new row without a real line to prove it would match nothing the agent ever sees."""
    exercised = {expected.pattern for _, expected, _ in SCENARIOS}
    untested = {p.name for p in patterns()} - exercised
    assert not untested, f"patterns with no scenario line: {sorted(untested)}"


def test_every_scenario_cites_its_format() -> None:
    assert all(citation.strip() for _, _, citation in SCENARIOS)


def test_a_prefixed_line_is_not_a_message() -> None:
    """Rows match the message text from its start: the reader strips the syslog/dmesg prefix
    (kmsg's text after ';', the journal's MESSAGE), and a fault quoted inside another message
    (a log line echoing a kernel line) is not a kernel fault."""
    line = (
        "kernel: [123.456789] nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 20009, Non-fatal, Link 28"
    )
    assert match_line(line) is None
    assert (
        match_line("agent: saw NVRM: Xid (PCI:0000:53:00): 79, GPU has fallen off the bus.") is None
    )


@pytest.mark.parametrize(
    "line",
    [
        "",
        "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024",
        "NVRM: GPU at PCI:0000:91:00: GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b",
        "NVRM: GPU 0000:91:00.0: GPU serial number is 1653723052734.",
        "NVRM: Xid (PCI:0000:01:00): garbled",
        "amdgpu 0000:03:00.0: amdgpu: Xid-like 79 GPU fault detected",
        "nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): garbled, Fatal",
        "pcieport 0000:00:01.0: AER: enabled with IRQ 122",
        "acpi PNP0A08:00: _OSC: OS now controls [PCIeHotplug PME AER PCIeCapability LTR]",
        "pci 0000:00:01.0: AER: can't find device of ID0100",
        "ena 0000:00:05.0: Reset indication didn't turn on",
        "ena 0000:00:05.0 eth0: Wait for completion (polling) timeout",
        "infiniband mlx5_0: Wait for completion (polling) timeout",
        "efa 0000:00:06.0 rdmap0s6: IB device registered",
        "task python3:1234 blocked on a mutex",
        "INFO: task python3:1234 blocked for more than a while",
        "nvidia-nvlink: Unregistered Nvlink Core, major device number 235",
        "NVRM: Xid (PCI:0000:53:00): 46 more text without a comma",
        "NVRM: GPU 0000:53:00.0: rm_init_adapter failed, device minor number 2",
        "NVRM: GPU 0000:53:00.0: RmInitAdapter succeeded!",
        "printk: console [ttyS0] enabled, bootconsole disabled",
        "net_ratelimit: callbacks suppressed",
    ],
)
def test_near_misses_do_not_match(line: str) -> None:
    assert match_line(line) is None


def test_binary_garbage_does_not_match() -> None:
    garbage = bytes(range(256)).decode("utf-8", errors="replace") + "\x00\xff\ufffd" * 50
    assert match_line(garbage) is None


def test_a_100_kb_line_without_a_fault_does_not_match() -> None:
    assert match_line("x" * 100_000) is None


def test_a_100_kb_line_full_of_near_misses_does_not_match() -> None:
    """Every literal of the prefilter, but no fault: the regexes run and must still say no."""
    chunk = "NVRM: Xid ( SXid ( fallen off the bus efa infiniband AER: Bus Error NVLink: "
    assert match_line((chunk + "blocked for more than ") * 1_200) is None


def test_the_fault_at_the_start_of_a_long_line_is_found() -> None:
    line = "NVRM: Xid (PCI:0000:53:00): 48, pid=1, name=a, " + "x" * 100_000
    got = match_line(line)
    assert got is not None
    assert (got.kind, got.code) == ("xid", 48)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0000:53:00", "0000:53:00.0"),
        ("PCI:0000:53:00", "0000:53:00.0"),
        ("0000:53:00.0", "0000:53:00.0"),
        ("0000:53:00.1", "0000:53:00.1"),
        ("53:00.0", "0000:53:00.0"),
        ("53:00", "0000:53:00.0"),
        ("0000:CB:00", "0000:cb:00.0"),
        ("0002:0A:1F.7", "0002:0a:1f.7"),
        ("10000:e1:00.0", "10000:e1:00.0"),
        (" 0000:53:00.0 ", "0000:53:00.0"),
    ],
)
def test_pci_addresses_come_out_in_sysfs_form(text: str, expected: str) -> None:
    assert nvrm_pci_to_sysfs(text) == expected


@pytest.mark.parametrize(
    "text",
    ["", "GPU-b6c3b2be", "0000:53", "0000:53:00.8", "0000:53:20.0", "zz:00.0", "0000:53:00."],
)
def test_things_that_are_not_pci_addresses_are_refused(text: str) -> None:
    assert nvrm_pci_to_sysfs(text) is None


def _rows() -> list[dict[str, str]]:
    text = resources.files("exporter.core.data").joinpath("kernel-log-patterns.csv").read_text()
    return list(csv.DictReader(text.splitlines()))


def test_the_table_has_the_documented_columns() -> None:
    text = resources.files("exporter.core.data").joinpath("kernel-log-patterns.csv").read_text()
    header = next(csv.reader(text.splitlines()))
    assert header == ["name", "kind", "severity", "regex", "source"]


def test_every_row_is_well_formed() -> None:
    rows = _rows()
    names = [r["name"] for r in rows]
    assert len(names) == len(set(names)), "pattern names must be unique"
    for r in rows:
        assert r["kind"] in KINDS, r["name"]
        assert r["severity"] in SEVERITIES, r["name"]
        assert r["source"].strip(), f"{r['name']} cites no source"
        groups = set(re.compile(r["regex"]).groupindex)
        assert groups <= GROUPS, f"{r['name']} uses unknown groups {groups - GROUPS}"


def test_every_kind_has_a_pattern() -> None:
    assert {p.kind for p in patterns()} == set(KINDS)


def test_xid_rows_come_before_the_rows_their_lines_also_match() -> None:
    """XID 79 and XID 74 lines also say "fallen off the bus" / "NVLink: ... link N"; the
    first match wins, so the XID rows must come first for them to stay XIDs."""
    kinds = [p.kind for p in patterns()]
    first = {k: kinds.index(k) for k in KINDS}
    assert first["xid"] < first["gpu_fallen_off_bus"]
    assert first["xid"] < first["nvlink"]


KMSG_SAMPLE = Path(__file__).parents[1] / "fixtures" / "kernel-log" / "kmsg-sample.txt"


def _kmsg_messages(text: str) -> list[tuple[int, str]]:
    """(sequence number, message text) of each /dev/kmsg record; dictionary lines skipped."""
    records = []
    for line in text.splitlines():
        if line.startswith(" ") or not line:
            continue
        header, message = line.split(";", 1)
        records.append((int(header.split(",")[1]), message))
    return records


def test_a_kmsg_dump_yields_exactly_its_faults() -> None:
    """Faults among the lines the same drivers print around them (banners, serial numbers,
    AER capability and status detail, hung-task follow-ups): only the faults come out."""
    found = {
        seq: got
        for seq, message in _kmsg_messages(KMSG_SAMPLE.read_text())
        if (got := match_line(message)) is not None
    }
    assert found == {
        1005: LogMatch("xid", "xid", "error", code=79, pci_address="0000:53:00.0"),
        1006: LogMatch(
            "gpu_fallen_off_bus", "gpu_fallen_off_bus", "fatal", pci_address="0000:53:00.0"
        ),
        1008: LogMatch("xid", "xid", "error", code=74, pci_address="0000:b9:00.0", device="link 6"),
        1009: LogMatch(
            "sxid",
            "sxid",
            "warning",
            code=12028,
            pci_address="0000:05:00.0",
            device="nvidia-nvswitch3",
        ),
        1010: LogMatch(
            "pcie_aer",
            "aer_pcie_bus_error",
            "corrected",
            pci_address="0000:53:00.0",
            device="nvidia",
        ),
        1012: LogMatch(
            "pcie_aer",
            "aer_error_message_received",
            "corrected",
            pci_address="0000:53:00.0",
            device="0000:00:01.0",
        ),
        1013: LogMatch(
            "efa_driver",
            "efa_admin_cmd_failed",
            "error",
            pci_address="0000:10:1b.0",
            device="rdmap16s27",
        ),
        1014: LogMatch("hung_task", "hung_task", "warning", device="python3:1234"),
        1017: LogMatch(
            "gpu_fallen_off_bus",
            "gpu_fallen_off_bus_at_probe",
            "fatal",
            pci_address="0000:b3:00.0",
        ),
        1018: LogMatch("xid", "xid", "error", code=46, pci_address="0000:53:00.0"),
        1019: LogMatch("xid", "xid", "error", code=154, pci_address="0000:53:00.0"),
        1020: LogMatch("uvm_fatal", "uvm_fatal_error", "fatal"),
        1021: LogMatch(
            "gpu_init_failed", "rm_init_adapter_failed", "fatal", pci_address="0000:b3:00.0"
        ),
        1023: LogMatch(
            "printk_suppressed",
            "printk_callbacks_suppressed",
            "warning",
            code=12,
            device="efa_com_wait_and_process_admin_cq_interrupts",
        ),
    }


@pytest.mark.parametrize("line", [s[0] for s in SCENARIOS])
def test_the_raw_record_gate_never_refuses_a_line_the_table_matches(line: str) -> None:
    """The reader skips parsing records `record_may_match` refuses: a fault line refused there
    would be lost. Every scenario line passes it as a /dev/kmsg record would carry it."""
    raw = f"3,4711,90512345,-;{line}\n".encode()
    assert match_line(line) is not None
    assert record_may_match(raw)


def test_the_raw_record_gate_refuses_ordinary_lines() -> None:
    ordinary = [
        "EXT4-fs (nvme0n1p1): mounted filesystem with ordered data mode.",
        "ena 0000:00:05.0 eth0: Local page cache is disabled for less than 16 channels",
        "systemd[1]: Started Journal Service.",
        "IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready",
    ]
    for line in ordinary:
        assert not record_may_match(f"6,12,345,-;{line}\n".encode()), line
