"""The `admission:` section of the cluster service's config, validated with clear errors.

Off unless an admin turns it on, and then in observe mode (decide and record, write nothing)
until they choose enforce: an observer that writes to Kueue's objects can hold a whole cluster's
admissions, so writing is opted into twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

CONTROLLER_NAME = "topowatch.io/node-health"
MODES = ("observe", "enforce")
DEFAULT_FAIL_OPEN_S = 120.0
DEFAULT_INTERVAL_S = 2.0
_KEYS = frozenset({"enabled", "mode", "checks", "fail_open_seconds", "reject", "interval_seconds"})


class AdmissionSettingsError(ValueError):
    """A setting that cannot be used; the message names it."""


@dataclass(frozen=True, slots=True)
class AdmissionSettings:
    """What the controller is allowed to do.

    `checks`: the AdmissionCheck names that count; empty means every AdmissionCheck whose
    spec.controllerName is ours. `fail_open_seconds`: a workload not judged within this long of
    its check turning Pending is answered Ready (Kueue waits on a Pending check forever, so an
    observer that cannot see must let go). `reject`: answer Rejected (Kueue deactivates the
    workload) when its flavor cannot hold it on healthy nodes at all; off, such a workload gets
    Retry like any other."""

    enabled: bool = False
    mode: Literal["observe", "enforce"] = "observe"
    checks: tuple[str, ...] = ()
    fail_open_seconds: float = DEFAULT_FAIL_OPEN_S
    reject: bool = False
    interval_seconds: float = DEFAULT_INTERVAL_S

    @property
    def writes(self) -> bool:
        return self.enabled and self.mode == "enforce"


def settings_from_mapping(raw: object) -> AdmissionSettings:
    """The settings of a config document: its `admission:` section (a document without one is
    the defaults: off). Unknown keys, wrong types and out-of-range values raise
    AdmissionSettingsError naming the key, so a typo never silently leaves a default."""
    if raw is None:
        return AdmissionSettings()
    if not isinstance(raw, Mapping):
        raise AdmissionSettingsError(f"expected a mapping at the top, got {type(raw).__name__}")
    section = raw.get("admission")
    if section is None:
        return AdmissionSettings()
    if not isinstance(section, Mapping):
        raise AdmissionSettingsError(f"admission: expected a mapping, got {type(section).__name__}")
    unknown = sorted(str(k) for k in section if k not in _KEYS)
    if unknown:
        raise AdmissionSettingsError(
            f"admission: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(_KEYS))})"
        )
    mode = section.get("mode", "observe")
    if mode not in MODES:
        raise AdmissionSettingsError(f"admission.mode: expected observe or enforce, got {mode!r}")
    return AdmissionSettings(
        enabled=_flag(section, "enabled", False),
        mode=mode,
        checks=_names(section.get("checks")),
        fail_open_seconds=_seconds(section, "fail_open_seconds", DEFAULT_FAIL_OPEN_S, 0.0),
        reject=_flag(section, "reject", False),
        interval_seconds=_seconds(section, "interval_seconds", DEFAULT_INTERVAL_S, 0.1),
    )


def _flag(section: Mapping[str, Any], key: str, default: bool) -> bool:
    value = section.get(key, default)
    if not isinstance(value, bool):
        raise AdmissionSettingsError(f"admission.{key}: expected true or false, got {value!r}")
    return value


def _seconds(section: Mapping[str, Any], key: str, default: float, least: float) -> float:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise AdmissionSettingsError(
            f"admission.{key}: expected a number of seconds, got {value!r}"
        )
    if value < least:
        raise AdmissionSettingsError(f"admission.{key}: must be at least {least:g}, got {value!r}")
    return float(value)


def _names(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise AdmissionSettingsError(
            f"admission.checks: expected a list of AdmissionCheck names, got {value!r}"
        )
    return tuple(dict.fromkeys(value))
