"""`topowatch slurm-controller`'s configuration file (YAML), read strictly at start-up.

A setting that is misspelt or out of range stops the start with a message naming it: on a head node
a controller that silently fell back to defaults could act where the admin said observe. The
`policy` section is the same as the Kubernetes controller's (healthcheck.remediation.policy),
observe by default."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import yaml

from exporter.slurm.reports import OPT_OUT_FEATURE
from exporter.sources.slurm.commands import unset
from exporter.topology.hostlist import expand
from healthcheck.remediation.policy import PolicyConfig
from healthcheck.remediation.providers.slurm import METHODS, Method

DEFAULT_AGENT_PORT = 9402  # `topowatch node`'s default
DEFAULT_LISTEN = "0.0.0.0:9404"  # 9403 is `topowatch cluster`
_SECTIONS = {
    "cluster",
    "interval_seconds",
    "agents",
    "slurm",
    "remediation",
    "prometheus",
    "listen",
    "topology_file",
}
_AGENT_KEYS = {"port", "token_file", "timeout_seconds", "concurrency", "scheme", "watch_seconds"}
_SLURM_KEYS = {"bin_dir", "timeout_seconds", "method", "opt_out_feature", "exclude_nodes"}
_REMEDIATION_KEYS = {"state_file", "admin_token_file", "policy"}
_PROMETHEUS_KEYS = {"file_sd", "placement"}


class SettingsError(ValueError):
    """The configuration cannot be used; the message names the setting."""


@dataclass(frozen=True, slots=True)
class Settings:
    cluster: str = "slurm"
    interval_s: float = 30.0
    agent_port: int = DEFAULT_AGENT_PORT
    token_file: Path = Path("/etc/topowatch/health-token")
    agent_timeout_s: float = 5.0
    concurrency: int = 200
    # Long-poll each agent for this long (it answers at once when its findings change): a node
    # turning bad is acted on within about a second, not at the next poll. 0: poll every cycle.
    watch_s: float = 25.0
    scheme: str = "http"
    bin_dir: str | None = None
    slurm_timeout_s: float = 15.0
    method: Method = "hyperpod"
    opt_out_feature: str = OPT_OUT_FEATURE
    exclude_nodes: frozenset[str] = frozenset()
    state_file: Path = Path("/var/lib/topowatch-slurm-controller/slurm-controller-state.json")
    admin_token_file: Path | None = None
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    file_sd: Path | None = None
    placement: bool = True
    listen_host: str = "0.0.0.0"
    listen_port: int = 9404
    topology_file: Path | None = None


def check_against_slurm(settings: Settings, config: Mapping[str, str]) -> None:
    """What the settings need from slurm.conf, checked against `scontrol show config` once at
    start-up; SettingsError in one line when it is missing. `reboot-asap` runs `scontrol reboot
    ASAP`, which slurmctld refuses without RebootProgram ("RebootProgram isn't defined";
    scontrol(1), "reboot": "the RebootProgram configured in slurm.conf"): without it every
    decision would fail at the node, one by one, instead of the start."""
    if settings.method == "reboot-asap" and unset(config.get("RebootProgram")):
        shown = config.get("RebootProgram", "absent")
        raise SettingsError(
            f"slurm.method reboot-asap needs RebootProgram in slurm.conf (scontrol show config:"
            f" RebootProgram = {shown}); set it, or use slurm.method hyperpod or drain"
        )


def load_settings(path: Path) -> Settings:
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise SettingsError(f"cannot read {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise SettingsError(f"{path} is not YAML: {exc}") from exc
    return settings_from_mapping(raw or {})


def settings_from_mapping(raw: Any) -> Settings:
    top = _section(raw, "the file", _SECTIONS)
    agents = _section(top.get("agents", {}), "agents", _AGENT_KEYS)
    slurm = _section(top.get("slurm", {}), "slurm", _SLURM_KEYS)
    remediation = _section(top.get("remediation", {}), "remediation", _REMEDIATION_KEYS)
    prometheus = _section(top.get("prometheus", {}), "prometheus", _PROMETHEUS_KEYS)
    policy, problems = PolicyConfig.from_mapping(
        _section(remediation.get("policy", {}), "remediation.policy", None)
    )
    if problems:
        raise SettingsError("remediation.policy: " + "; ".join(problems))
    method = slurm.get("method", "hyperpod")
    if method not in METHODS:
        raise SettingsError(f"slurm.method {method!r} is not one of {', '.join(METHODS)}")
    scheme = agents.get("scheme", "http")
    if scheme not in ("http", "https"):
        raise SettingsError(f"agents.scheme {scheme!r} is not http or https")
    host, _, port = str(top.get("listen", DEFAULT_LISTEN)).rpartition(":")
    defaults = Settings()
    return Settings(
        cluster=_text(top, "cluster", defaults.cluster),
        interval_s=_number(top, "interval_seconds", defaults.interval_s, low=1),
        agent_port=int(_number(agents, "port", defaults.agent_port, low=1, high=65535)),
        token_file=Path(_text(agents, "token_file", str(defaults.token_file))),
        agent_timeout_s=_number(agents, "timeout_seconds", defaults.agent_timeout_s, low=0.1),
        concurrency=int(_number(agents, "concurrency", defaults.concurrency, low=1, high=4096)),
        watch_s=_number(agents, "watch_seconds", defaults.watch_s, low=0, high=25),
        scheme=scheme,
        bin_dir=slurm.get("bin_dir"),
        slurm_timeout_s=_number(slurm, "timeout_seconds", defaults.slurm_timeout_s, low=0.1),
        method=cast(Method, method),
        opt_out_feature=_text(slurm, "opt_out_feature", defaults.opt_out_feature),
        exclude_nodes=_hostlists(slurm.get("exclude_nodes", [])),
        state_file=Path(_text(remediation, "state_file", str(defaults.state_file))),
        admin_token_file=_path(remediation.get("admin_token_file"), "admin_token_file"),
        policy=policy,
        file_sd=_path(prometheus.get("file_sd"), "prometheus.file_sd"),
        placement=bool(prometheus.get("placement", True)),
        listen_host=host or "0.0.0.0",
        listen_port=_port(port),
        topology_file=_path(top.get("topology_file"), "topology_file"),
    )


def _section(value: Any, where: str, known: set[str] | None) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise SettingsError(f"{where} must be a mapping, got {type(value).__name__}")
    if known is not None:
        unknown = sorted(str(k) for k in value if k not in known)
        if unknown:
            raise SettingsError(f"{where}: unknown setting(s) {unknown}; known: {sorted(known)}")
    return value


def _text(section: Mapping[str, Any], key: str, default: str) -> str:
    value = section.get(key, default)
    if not isinstance(value, str) or not value:
        raise SettingsError(f"{key} must be a non-empty string")
    return value


def _number(
    section: Mapping[str, Any], key: str, default: float, low: float, high: float | None = None
) -> float:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < low:
        raise SettingsError(f"{key}={value!r} must be a number >= {low:g}")
    if high is not None and value > high:
        raise SettingsError(f"{key}={value!r} must be <= {high:g}")
    return float(value)


def _path(value: Any, key: str) -> Path | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise SettingsError(f"{key} must be a path")
    return Path(value)


def _port(text: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise SettingsError(f"listen port {text!r} is not a port number")
    return int(text)


def _hostlists(value: Any) -> frozenset[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SettingsError("slurm.exclude_nodes must be a list of node names or hostlists")
    names: set[str] = set()
    for expression in value:
        try:
            names.update(expand(expression))
        except ValueError as exc:
            raise SettingsError(f"slurm.exclude_nodes: {exc}") from exc
    return frozenset(names)
