"""Health-check thresholds: sane defaults, optionally overridden by a YAML or JSON file.

Every threshold lives here so that an operator can tune a check without a new build, and a
typo in the file is an error naming the key rather than a silently ignored setting:

    damping: {k: 3, n: 5}
    damping_overrides: {thermal_slowdown: {k: 6, n: 10}}
    xid: {hold_seconds: 3600, app_repeat_jobs: 2}
    nvml: {reset_action: reboot, timeout_action: reboot, timeout_needs_evidence: true}
    nvlink: {max_errors_per_second: {crc_flit: 10, rx: 10}}
    fabric: {startup_grace_seconds: 300, action: reboot}
    kernel_log: {hold_seconds: 3600, fatal_action: reboot, error_action: none}
    instance_types: {ml.p5.48xlarge: {gpus: 8, efa: 32}}
    custom_checks: [{name: gpu-burn, path: /opt/checks/burn.sh, args: [-q], action: reboot}]
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from exporter.core.findings import ACTIONS


class ConfigError(ValueError):
    """A configuration file or value that cannot be used; the message names the key."""


@dataclass(frozen=True, slots=True)
class InstanceShape:
    gpus: int
    efa: int


# Accelerator and EFA device counts per instance type (AWS instance-type documentation).
# `ml.` (SageMaker HyperPod) names are accepted through `expected_shape`.
DEFAULT_INSTANCE_TYPES: Mapping[str, InstanceShape] = MappingProxyType(
    {
        "p4d.24xlarge": InstanceShape(gpus=8, efa=4),
        "p4de.24xlarge": InstanceShape(gpus=8, efa=4),
        "p5.48xlarge": InstanceShape(gpus=8, efa=32),
        "p5e.48xlarge": InstanceShape(gpus=8, efa=32),
        "p5en.48xlarge": InstanceShape(gpus=8, efa=16),
        "p6-b200.48xlarge": InstanceShape(gpus=8, efa=8),
        "p6e-gb200.36xlarge": InstanceShape(gpus=4, efa=8),
    }
)

# Per-link error counters the NVLink check can rate: the DL counters up to Hopper, then NVLink5's
# NVML_FI_DEV_NVLINK_COUNT_* (Blackwell), where the DL counters are gone.
NVLINK_COUNTERS = (
    "crc_flit",
    "crc_data",
    "replay",
    "recovery",
    "rx",
    "rx_malformed_packet",
    "rx_buffer_overrun",
    "rx_remote",
    "rx_general",
    "local_link_integrity",
    "tx_discards",
    "link_recovery",
    "link_recovery_failed",
)


@dataclass(frozen=True, slots=True)
class Damping:
    """A finding is actionable once present in `k` of the last `n` polls."""

    k: int = 3
    n: int = 5

    def __post_init__(self) -> None:
        if not 1 <= self.k <= self.n:
            raise ConfigError(f"damping needs 1 <= k <= n, got k={self.k} n={self.n}")


@dataclass(frozen=True, slots=True)
class XidConfig:
    # The same XID on the same GPU within this many seconds of the last is one incident
    # (drivers repeat an XID in bursts; one fault must not count as many).
    dedup_seconds: float = 60.0
    # An XID is an event; its finding stays active this long after the last incident.
    hold_seconds: float = 3600.0
    # Usually the application's fault: recommend nothing alone...
    app_xids: frozenset[int] = frozenset({13, 31, 43, 45, 94})
    # ...but on the same GPU across this many different jobs (pods) within the window,
    # the GPU is the common factor: reboot.
    app_repeat_jobs: int = 2
    app_repeat_window_seconds: float = 86400.0


@dataclass(frozen=True, slots=True)
class NvmlConfig:
    """What NVML's own failures ask for (healthcheck/detection/checks/inventory.py; the codes'
    meaning is decided in exporter/sources/nvml.py). Deployment faults never act: that is not a
    setting."""

    # RESET_REQUIRED ("the GPU requires a reset before it can be used again"): a GPU reset,
    # which on a managed node means a reboot.
    reset_action: str = "reboot"
    # A GPU whose NVML calls time out is retried every poll; once the timeouts hold for K of N
    # polls (damping, check `gpu_timeout`) and other evidence agrees (see inventory.py), this.
    timeout_action: str = "reboot"
    # Act on persistent timeouts only when the kernel or the GPU's other errors agree.
    timeout_needs_evidence: bool = True


@dataclass(frozen=True, slots=True)
class MemoryConfig:
    uncorrected_volatile_max: int = 0  # volatile DBEs tolerated before they are reported
    retired_pages_max: int = 60  # NVIDIA's RMA guidance: retirement table nearly full


@dataclass(frozen=True, slots=True)
class NvlinkConfig:
    max_errors_per_second: Mapping[str, float] = field(
        default_factory=lambda: MappingProxyType(
            {
                "crc_flit": 10.0,
                "crc_data": 10.0,
                "replay": 10.0,
                "recovery": 0.1,
                # NVLink5: packets in error as the CRC counters were, a recovery as a DL
                # recovery, and any failed recovery. Not rx_remote: a stomped packet is the
                # remote end's error, arriving on a healthy link.
                "rx": 10.0,
                "rx_malformed_packet": 10.0,
                "rx_buffer_overrun": 10.0,
                "rx_general": 10.0,
                "tx_discards": 10.0,
                "local_link_integrity": 0.1,
                "link_recovery": 0.1,
                "link_recovery_failed": 0.0,
            }
        )
    )


@dataclass(frozen=True, slots=True)
class FabricConfig:
    # A GPU registers with the fabric (Fabric Manager, NVLink domain) some time after boot: its
    # fabric is judged only this long after the agent first read the GPU.
    startup_grace_seconds: float = 300.0
    # A fabric that did not complete, or completed failed, is repaired by a reboot (the GPU
    # registers again); NVSwitch trays and cabling are the next rungs of the ladder.
    action: str = "reboot"


@dataclass(frozen=True, slots=True)
class PcieConfig:
    # GPUs lower their PCIe generation when idle to save power; a generation below max only
    # counts while the GPU is at least this busy (width never changes by design).
    min_utilization_for_generation: float = 0.05


@dataclass(frozen=True, slots=True)
class ThermalConfig:
    reasons: frozenset[str] = frozenset(
        {"hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}
    )
    sustain_seconds: float = 60.0
    # A fan or a power shelf is not fixed by a reboot: report, do not act, unless told to.
    action: str = "none"


@dataclass(frozen=True, slots=True)
class EfaConfig:
    # A dead peer raises these counters on every healthy node that talks to it, so they are a
    # warning with no action: acting on them would take out healthy nodes by the dozen.
    remote_errors_per_second: float = 1.0  # NVSentinel's efa_unresponsive/impaired: > 1/s
    remote_counters: frozenset[str] = frozenset(
        {"unresponsive_remote_events", "impaired_remote_conn_events"}
    )
    # The device's own errors (efa_device_errors). cmds_err and rx_drops: NVSentinel's
    # nic-health-monitor (> 10/min, > 100/s; EKS NMA also allows rx_drops 100/s).
    # retrans_timeout_events: EKS node monitoring agent's rate (1/s sustained).
    cmds_err_per_minute: float = 10.0
    rx_drops_per_second: float = 100.0
    retrans_timeouts_per_second: float = 1.0
    # A device error is a warning; it can also be lost traffic to a sick peer, so no action
    # unless told to.
    device_errors_action: str = "none"


@dataclass(frozen=True, slots=True)
class KernelLogConfig:
    """What kernel log lines ask for (healthcheck/detection/checks/kernel_log.py). XID lines are not
    judged here: they join NVML's XIDs and the XID check judges them by NVIDIA's catalog."""

    # A line is an event: its finding stays active this long after the latest such line.
    hold_seconds: float = 3600.0
    # Lines the pattern table marks fatal: a GPU fallen off the bus, an uncorrectable fatal
    # PCIe error, a fatal SXID, an EFA device reset that failed. A reboot is the first rung.
    fatal_action: str = "reboot"
    # Errors (an EFA admin command timeout, an uncorrected non-fatal AER, an NVLink error
    # line): reported; the driver or hardware usually recovers, so act only if told to.
    error_action: str = "none"
    # Corrected PCIe errors are counted, not reported, unless one device logged this many since
    # the agent started and the latest is within the hold window (0: never report them).
    corrected_report_count: int = 0


@dataclass(frozen=True, slots=True)
class HealthConfig:
    damping: Damping = field(default_factory=Damping)
    damping_overrides: Mapping[str, Damping] = field(default_factory=dict)  # by check id
    xid: XidConfig = field(default_factory=XidConfig)
    nvml: NvmlConfig = field(default_factory=NvmlConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    nvlink: NvlinkConfig = field(default_factory=NvlinkConfig)
    fabric: FabricConfig = field(default_factory=FabricConfig)
    pcie: PcieConfig = field(default_factory=PcieConfig)
    thermal: ThermalConfig = field(default_factory=ThermalConfig)
    efa: EfaConfig = field(default_factory=EfaConfig)
    kernel_log: KernelLogConfig = field(default_factory=KernelLogConfig)
    instance_types: Mapping[str, InstanceShape] = field(
        default_factory=lambda: DEFAULT_INSTANCE_TYPES
    )
    custom_checks: tuple[CustomCheckConfig, ...] = ()  # admins' own scripts (NPD protocol)

    def damping_for(self, check: str) -> Damping:
        if check.startswith(CUSTOM_CHECK_PREFIX):
            return PER_POLL  # damped over the script's runs by the check (checks/custom.py)
        return self.damping_overrides.get(check, self.damping)

    def expected_shape(self, instance_type: str) -> InstanceShape | None:
        """GPU and EFA counts for `p5.48xlarge` or `ml.p5.48xlarge`; None when unknown."""
        name = instance_type.strip()
        shape = self.instance_types.get(name)
        if shape is None and name.startswith("ml."):
            shape = self.instance_types.get(name[3:])
        return shape


@dataclass(frozen=True, slots=True)
class CustomCheckConfig:
    """One admin script, run as node-problem-detector's custom plugin monitor runs it
    (exporter/sources/custom_checks.py): exit 0 OK, 1 a problem, anything else unknown.

    A problem asks for `action` once it held in `damping.k` of the script's last `damping.n`
    runs (not polls: one run's result stands until the next run)."""

    name: str
    path: str  # absolute; executed directly, never through a shell
    args: tuple[str, ...] = ()
    interval_seconds: float = 30.0  # NPD's invoke_interval default
    timeout_seconds: float = 5.0  # NPD's timeout default
    action: str = "none"  # what a problem asks for
    damping: Damping = field(default_factory=Damping)  # default: the top-level `damping`
    max_output_length: int = 80  # NPD's default: the message is stdout cut at this many bytes

    @property
    def check_id(self) -> str:
        """The findings' check id: `custom:NAME` (damping overrides and ladder rules use it)."""
        return CUSTOM_CHECK_PREFIX + self.name


CUSTOM_CHECK_PREFIX = "custom:"
CUSTOM_OUTPUT_MAX = 4096  # NPD keeps only the first 4 KiB of stdout: no message is longer
PER_POLL = Damping(k=1, n=1)
_CUSTOM_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_CUSTOM_KEYS = (
    "name",
    "path",
    "args",
    "interval_seconds",
    "timeout_seconds",
    "action",
    "damping",
    "max_output_length",
)


# --- loading --------------------------------------------------------------------------------


def load_config(path: str | Path) -> HealthConfig:
    """Read a YAML (or JSON, which is YAML) file; `ConfigError` says what is wrong."""
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read health config {path}: {e}") from e
    try:
        data = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        raise ConfigError(f"health config {path} is not valid YAML/JSON: {e}") from e
    try:
        return config_from_mapping({} if data is None else data)
    except ConfigError as e:
        raise ConfigError(f"health config {path}: {e}") from e


def config_from_mapping(data: object) -> HealthConfig:
    """Defaults overridden by `data`; unknown keys and wrong types raise `ConfigError`."""
    top = _mapping(data, "health config")
    base = HealthConfig()
    values: dict[str, Any] = {}
    for key, raw in top.items():
        if key == "damping":
            values[key] = _dataclass(base.damping, raw, "damping")
        elif key == "damping_overrides":
            table = _mapping(raw, key)
            values[key] = MappingProxyType(
                {
                    str(check): _dataclass(base.damping, v, f"{key}.{check}")
                    for check, v in table.items()
                }
            )
        elif key == "instance_types":
            table = _mapping(raw, key)
            extra = {
                str(name): _shape(v, f"{key}.{name}") for name, v in table.items()
            }  # extends the defaults: naming one type must not forget the others
            values[key] = MappingProxyType({**base.instance_types, **extra})
        elif key == "custom_checks":
            continue  # below: an entry's default damping is the top-level one
        elif key in (
            "xid",
            "nvml",
            "memory",
            "nvlink",
            "fabric",
            "pcie",
            "thermal",
            "efa",
            "kernel_log",
        ):
            values[key] = _dataclass(getattr(base, key), raw, key)
        else:
            raise ConfigError(_unknown(key, "", [f.name for f in dataclasses.fields(base)]))
    if "custom_checks" in top:
        default = values.get("damping", base.damping)
        values["custom_checks"] = _custom_checks(top["custom_checks"], default)
    config = dataclasses.replace(base, **values)
    _validate(config)
    return config


def _validate(config: HealthConfig) -> None:
    _validate_custom(config)
    for name, action in (
        ("thermal.action", config.thermal.action),
        ("nvml.reset_action", config.nvml.reset_action),
        ("nvml.timeout_action", config.nvml.timeout_action),
        ("fabric.action", config.fabric.action),
        ("efa.device_errors_action", config.efa.device_errors_action),
        ("kernel_log.fatal_action", config.kernel_log.fatal_action),
        ("kernel_log.error_action", config.kernel_log.error_action),
    ):
        if action not in ACTIONS:
            raise ConfigError(f"{name} must be one of {', '.join(ACTIONS)}")
    unknown = set(config.nvlink.max_errors_per_second) - set(NVLINK_COUNTERS)
    if unknown:
        raise ConfigError(
            f"nvlink.max_errors_per_second: unknown counter(s) {', '.join(sorted(unknown))};"
            f" known: {', '.join(NVLINK_COUNTERS)}"
        )
    numbers = {
        "xid.dedup_seconds": config.xid.dedup_seconds,
        "xid.hold_seconds": config.xid.hold_seconds,
        "xid.app_repeat_window_seconds": config.xid.app_repeat_window_seconds,
        "memory.uncorrected_volatile_max": config.memory.uncorrected_volatile_max,
        "memory.retired_pages_max": config.memory.retired_pages_max,
        "thermal.sustain_seconds": config.thermal.sustain_seconds,
        "fabric.startup_grace_seconds": config.fabric.startup_grace_seconds,
        "kernel_log.hold_seconds": config.kernel_log.hold_seconds,
        "kernel_log.corrected_report_count": config.kernel_log.corrected_report_count,
        "efa.remote_errors_per_second": config.efa.remote_errors_per_second,
        "efa.cmds_err_per_minute": config.efa.cmds_err_per_minute,
        "efa.rx_drops_per_second": config.efa.rx_drops_per_second,
        "efa.retrans_timeouts_per_second": config.efa.retrans_timeouts_per_second,
        **{
            f"nvlink.max_errors_per_second.{k}": v
            for k, v in config.nvlink.max_errors_per_second.items()
        },
    }
    for name, value in numbers.items():
        if value < 0:
            raise ConfigError(f"{name} must not be negative, got {value}")
    if config.xid.app_repeat_jobs < 1:
        raise ConfigError("xid.app_repeat_jobs must be at least 1")


def _unknown(key: object, section: str, known: list[str]) -> str:
    where = f"{section}.{key}" if section else str(key)
    return f"unknown key {where!r}; known: {', '.join(sorted(known))}"


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where} must be a mapping, got {type(value).__name__}")
    return value


def _shape(value: object, where: str) -> InstanceShape:
    table = _mapping(value, where)
    for key in table:
        if key not in ("gpus", "efa"):
            raise ConfigError(_unknown(key, where, ["gpus", "efa"]))
    try:
        gpus, efa = table["gpus"], table["efa"]
    except KeyError as e:
        raise ConfigError(f"{where} needs both gpus and efa") from e
    return InstanceShape(gpus=_int(gpus, f"{where}.gpus"), efa=_int(efa, f"{where}.efa"))


def _dataclass(default: Any, raw: object, where: str) -> Any:
    """`default` with the fields `raw` names replaced, each coerced to the default's type."""
    table = _mapping(raw, where)
    names = {f.name for f in dataclasses.fields(default)}
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key not in names:
            raise ConfigError(_unknown(key, where, sorted(names)))
        values[key] = _coerce(getattr(default, key), value, f"{where}.{key}")
    return dataclasses.replace(default, **values)


def _coerce(default: object, value: object, where: str) -> object:
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false")
        return value
    if isinstance(default, int):
        return _int(value, where)
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where} must be a number")
        return float(value)
    if isinstance(default, str):
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string")
        return value
    if isinstance(default, frozenset):
        if not isinstance(value, list):
            raise ConfigError(f"{where} must be a list")
        sample = next(iter(default), "")
        if isinstance(sample, int):
            return frozenset(_int(v, where) for v in value)
        return frozenset(str(v) for v in value)
    if isinstance(default, Mapping):
        table = _mapping(value, where)
        merged = {**default}
        for k, v in table.items():
            sample = merged.get(k, next(iter(default.values()), 0.0))
            merged[str(k)] = _coerce(sample, v, f"{where}.{k}")
        return MappingProxyType(merged)
    raise ConfigError(f"{where}: cannot be configured")  # pragma: no cover - a new field type


def _int(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where} must be an integer")
    return value


def _custom_checks(raw: object, damping: Damping) -> tuple[CustomCheckConfig, ...]:
    """The `custom_checks` list: each entry's keys checked, names unique."""
    if not isinstance(raw, list):
        raise ConfigError(f"custom_checks must be a list, got {type(raw).__name__}")
    out: list[CustomCheckConfig] = []
    for i, item in enumerate(raw):
        where = f"custom_checks[{i}]"
        table = _mapping(item, where)
        for key in table:
            if key not in _CUSTOM_KEYS:
                raise ConfigError(_unknown(key, where, list(_CUSTOM_KEYS)))
        name, path = table.get("name"), table.get("path")
        if not isinstance(name, str) or not _CUSTOM_NAME.match(name):
            raise ConfigError(
                f"{where}.name must be lower-case letters, digits, '.', '_' or '-' (at most 63)"
            )
        where = f"custom_checks.{name}"
        if not isinstance(path, str) or not path.startswith("/"):
            raise ConfigError(f"{where}.path must be an absolute path (no shell, no PATH search)")
        args = table.get("args", [])
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ConfigError(f"{where}.args must be a list of strings")
        check = CustomCheckConfig(name=name, path=path, args=tuple(args), damping=damping)
        values: dict[str, Any] = {}
        for key in ("interval_seconds", "timeout_seconds", "action", "max_output_length"):
            if key in table:
                values[key] = _coerce(getattr(check, key), table[key], f"{where}.{key}")
        if "damping" in table:
            values["damping"] = _dataclass(damping, table["damping"], f"{where}.damping")
        out.append(dataclasses.replace(check, **values))
    names = [c.name for c in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"custom_checks: names must be unique, repeated: {', '.join(twice)}")
    return tuple(out)


def _validate_custom(config: HealthConfig) -> None:
    for c in config.custom_checks:
        where = f"custom_checks.{c.name}"
        if c.action not in ACTIONS:
            raise ConfigError(f"{where}.action must be one of {', '.join(ACTIONS)}")
        for key, value in (
            ("interval_seconds", c.interval_seconds),
            ("timeout_seconds", c.timeout_seconds),
        ):
            if not value > 0:
                raise ConfigError(f"{where}.{key} must be positive, got {value}")
        if not 1 <= c.max_output_length <= CUSTOM_OUTPUT_MAX:
            raise ConfigError(f"{where}.max_output_length must be 1 to {CUSTOM_OUTPUT_MAX}")
    custom = sorted(k for k in config.damping_overrides if k.startswith(CUSTOM_CHECK_PREFIX))
    if custom:
        raise ConfigError(
            f"damping_overrides: {', '.join(custom)}: custom checks are damped over their runs;"
            " set `damping` in their custom_checks entry"
        )
