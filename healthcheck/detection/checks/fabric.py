"""Fabric: a GPU whose NVLink fabric registration did not complete, or completed failed.

On NVSwitch systems (HGX Hopper, GB200 NVL) each GPU registers with the fabric (Fabric
Manager, or the NVLink domain's switch trays) after boot; until it has, it cannot talk to its
peers over NVLink. NVML reports the registration through `nvmlDeviceGetGpuFabricInfo(V)`
(nvml.h, NVIDIA/go-nvml gen/nvml/nvml.h, `nvmlGpuFabricInfo_t` and `nvmlGpuFabricInfo_v2_t`):

* `state`, `NVML_GPU_FABRIC_STATE_*`: NOT_SUPPORTED (0, "Fabric Probe State not supported":
  a GPU without an NVSwitch fabric, also H100 PCIe and single-GPU shapes) is never a finding;
  NOT_STARTED (1) and IN_PROGRESS (2) are normal right after boot, so they count only once the
  start-up grace (`fabric.startup_grace_seconds`, from the agent's first reading of the GPU)
  has passed; COMPLETED (3) says the probe ended, not that it succeeded. The grace is for a
  registration still under way: one that COMPLETED with a failure will not succeed by waiting
  (the probe is over), so it is judged at once, grace or not. On GB200 a node whose fabric
  failed at boot would otherwise look healthy for its first five minutes, the very minutes in
  which it is handed a job.
* `status`, an `nvmlReturn_t`: "Error status, if any. Must be checked only if state returns
  'complete'". COMPLETED with a status other than NVML_SUCCESS is a failed registration and a
  finding. Seen on real nodes: `State: Completed, Status: Insufficient Resources, CliqueId: 0,
  ClusterUUID: 00000000-...` is a broken NVLink fabric that Azure's node validation now fails
  instead of returning the node to production (Azure/azhpc-images#506); NVSentinel's fabric
  state check judges the same way (COMPLETED and not Success: a fabric error, NVIDIA/NVSentinel
  #1382). torchcomms (meta-pytorch/torchcomms#936) met COMPLETED with a non-success status and
  an all-zero UUID on H100 machines and stopped treating such a fabric as usable, but whether
  those machines were healthy is not known. So a failed status alone on a one-node fabric
  (all-zero cluster UUID, HGX H100) is reported as a warning with no action: a reboot asked on
  an unconfirmed reading would be the harm this project exists to avoid. In a multi-node NVLink
  domain (GB200), or with an unhealthy route or a wrong configuration in the health mask, it is
  a failure with the configured action.
* `clusterUuid`: all zero on HGX H100, whose NVSwitch fabric is one node with no multi-node
  NVLink domain (torchcomms#1385: "On H100 (non-MNNVL), NVML may report state=COMPLETED with a
  zeroed cluster UUID"). A zero cluster UUID with a success status is therefore healthy, never
  a finding; it only means "no NVL domain".
* `healthMask` (v2 on; `NVML_GPU_FABRIC_HEALTH_MASK_*`, 2-bit fields, 0 = not supported): a
  route to the fabric marked unhealthy (ROUTE_UNHEALTHY_TRUE, shift 4) or an incorrect
  configuration (INCORRECT_CONFIGURATION, shift 8, 4 bits: 2 SysGUID, 3 chassis serial, 4 no
  partition, 5 insufficient NVLinks, 6 incompatible GPU firmware, 7 invalid location, 8 GPU
  state invalid) is a failure like a failed status. Degraded bandwidth (DEGRADED_BW_TRUE,
  shift 0) is a warning with no action: the GPU still works, slower, and the links behind it
  are judged by the NVLink check. Route and access-timeout recovery in progress (shifts 2 and
  6) are the fabric repairing itself: nothing.

A failed fabric asks for `fabric.action` (reboot: the GPU registers again at boot), damped as
every finding is.
"""

from __future__ import annotations

from exporter.core.findings import Finding
from exporter.core.snapshot import FabricInfo, NodeSnapshot
from exporter.core.ultraserver import NodeFabric, summarize
from healthcheck.detection.checks.base import History, finding
from healthcheck.detection.config import HealthConfig

# nvml.h NVML_GPU_FABRIC_HEALTH_MASK_*: (shift, width) of each field, and the values that
# mean a failure.
_DEGRADED_BW = (0, 0x3)
_DEGRADED_BW_TRUE = 1
_ROUTE_UNHEALTHY = (4, 0x3)
_ROUTE_UNHEALTHY_TRUE = 1
_INCORRECT_CONFIGURATION = (8, 0xF)
_INCORRECT_CONFIGURATIONS = {
    2: "incorrect SysGUID",
    3: "incorrect chassis serial number",
    4: "no partition",
    5: "insufficient NVLinks",
    6: "incompatible GPU firmware",
    7: "invalid location",
    8: "GPU state invalid",
}


def _get(mask: int, field: tuple[int, int]) -> int:
    shift, width = field
    return (mask >> shift) & width


def failure(fabric: FabricInfo) -> str | None:
    """Why this fabric reading is a failed registration, in words; None when it is not one
    (grace aside: a registration not yet completed is a failure only after the grace)."""
    if fabric.state == "not_supported":
        return None
    if fabric.state == "not_started":
        return "fabric registration has not started"
    if fabric.state == "in_progress":
        return "fabric registration still in progress"
    if fabric.healthy is False:
        return f"fabric registration completed with status {fabric.status or 'not success'}"
    mask = fabric.health_mask or 0
    problems = []
    if _get(mask, _ROUTE_UNHEALTHY) == _ROUTE_UNHEALTHY_TRUE:
        problems.append("route to the fabric unhealthy")
    config = _INCORRECT_CONFIGURATIONS.get(_get(mask, _INCORRECT_CONFIGURATION))
    if config is not None:
        problems.append(f"incorrect configuration: {config}")
    if problems:
        return "fabric health mask: " + ", ".join(problems)
    return None


def _one_node_status_only(fabric: FabricInfo) -> bool:
    """Completed, its only fault a failed status, on a fabric of one node (no cluster UUID)."""
    if fabric.state != "completed" or fabric.healthy is not False or fabric.cluster_uuid:
        return False
    mask = fabric.health_mask or 0
    unhealthy = _get(mask, _ROUTE_UNHEALTHY) == _ROUTE_UNHEALTHY_TRUE
    return not unhealthy and _get(mask, _INCORRECT_CONFIGURATION) not in _INCORRECT_CONFIGURATIONS


def check(
    snapshot: NodeSnapshot, history: History, config: HealthConfig, now: float
) -> list[Finding]:
    out: list[Finding] = []
    grace = config.fabric.startup_grace_seconds
    for gpu in snapshot.gpu.gpus:
        fabric = gpu.fabric
        if not gpu.up or fabric is None or fabric.state == "not_supported":
            continue
        first = history.gpu_first_seen.get(gpu.uuid, now)
        if now - first < grace and fabric.state != "completed":
            continue  # still registering: give it the grace
        component = f"gpu{gpu.index}"
        why = failure(fabric)
        if why is not None and _one_node_status_only(fabric):
            # A failed status on a one-node NVSwitch fabric (all-zero cluster UUID: HGX H100)
            # is reported by machines whose health nobody could confirm (torchcomms#936): when
            # in doubt, say so and do not reboot. A real H100 fabric fault also shows as NVLink
            # down or erroring, which those checks act on.
            out.append(
                finding(
                    history,
                    now,
                    "gpu_fabric",
                    component,
                    "warning",
                    "none",
                    f"GPU {gpu.index}: {why} (one-node fabric, all-zero cluster UUID: reported,"
                    " not acted on)",
                )
            )
        elif why is not None:
            out.append(
                finding(
                    history,
                    now,
                    "gpu_fabric",
                    component,
                    "critical",
                    config.fabric.action,
                    f"GPU {gpu.index}: {why}",
                )
            )
        elif _get(fabric.health_mask or 0, _DEGRADED_BW) == _DEGRADED_BW_TRUE:
            out.append(
                finding(
                    history,
                    now,
                    "gpu_fabric_degraded_bandwidth",
                    component,
                    "warning",
                    "none",
                    f"GPU {gpu.index}: fabric bandwidth degraded (fabric health mask)",
                )
            )
    return out


def node_fabric(snapshot: NodeSnapshot) -> NodeFabric | None:
    """This node's fabric as the cluster judges its UltraServer with (exporter/core/
    ultraserver.py): each GPU up with a fabric counts, registered when COMPLETED and `failure`
    finds nothing (no grace: a GPU still registering is not in the domain yet). A lost GPU
    counts as not registered. None when no GPU has a fabric."""
    rows: list[tuple[int, str, bool, str, int | None, str]] = []
    for gpu in snapshot.gpu.gpus:
        fabric = gpu.fabric
        if not gpu.up:
            if fabric is not None and fabric.state != "not_supported":
                rows.append((gpu.index, "lost", False, "", None, "GPU lost"))
            continue
        if fabric is None:
            continue
        why = failure(fabric)
        ok = fabric.state == "completed" and why is None
        rows.append(
            (gpu.index, fabric.state, ok, fabric.cluster_uuid or "", fabric.clique_id, why or "")
        )
    return summarize(rows)
