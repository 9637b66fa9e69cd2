"""Resource names, quantities and taints as the simulated Kueue handles them.

Amounts are plain integers in Kueue's internal units (pkg/resources/resource.go
`ResourceValue`): cpu in millicores, every other resource (memory in bytes, GPUs, pods) in
whole units. They are printed the way Kueue's messages print them
(pkg/resources/resource_formatter.go `ResourceQuantity`): cpu as a milli quantity in DecimalSI
("96", "500m"), memory in canonical BinarySI ("500Gi"), the rest as plain numbers.

Taints and tolerations follow k8s.io/component-helpers/scheduling/corev1
`FindMatchingUntoleratedTaint` and core/v1 `Toleration.ToleratesTaint`, which Kueue calls both
when it checks a ResourceFlavor's nodeTaints (flavorassigner.go `checkFlavorForPodSets`) and
when TAS filters nodes (scheduling_simulator_default.go `FindFeasibleNodes`); only NoSchedule
and NoExecute taints count (pkg/util/taints `IsSchedulingTaint`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from exporter.topology.labels import HOSTNAME_KEY

GPU = "nvidia.com/gpu"
CPU = "cpu"
MEMORY = "memory"
PODS = "pods"
HOSTNAME = HOSTNAME_KEY

KI = 1024
GI = 1024**3
TI = 1024**4

Res = Mapping[str, int]
FlavorResource = tuple[str, str]  # (flavor, resource)

_BINARY = (("Ei", 1024**6), ("Pi", 1024**5), ("Ti", 1024**4), ("Gi", GI), ("Mi", 1024**2))


def quantity(resource: str, value: int) -> str:
    """`value` (Kueue's internal units) as Kueue prints it in a message or an API object."""
    if resource == CPU:
        if value % 1000 == 0:
            return str(value // 1000)
        return f"{value}m"
    if resource == MEMORY and value:
        for suffix, unit in _BINARY:
            if value % unit == 0:
                return f"{value // unit}{suffix}"
        if value % KI == 0:
            return f"{value // KI}Ki"
    return str(value)


def scaled(per_pod: Res, count: int) -> dict[str, int]:
    return {r: v * count for r, v in per_pod.items()}


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"

    def to_string(self) -> str:
        """core/v1 Taint.ToString: "key=value:effect" ("key:effect" without a value)."""
        if not self.value:
            return f"{self.key}:{self.effect}"
        return f"{self.key}={self.value}:{self.effect}"

    def go_value(self) -> str:
        """How Go's %s prints a corev1.Taint value (its String() has a pointer receiver, so
        fmt prints the struct's fields): flavorassigner.go's "untolerated taint %s" text."""
        return f"{{{self.key} {self.value} {self.effect} <nil>}}"

    def manifest(self) -> dict[str, str]:
        out = {"key": self.key, "effect": self.effect}
        if self.value:
            out["value"] = self.value
        return out


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"  # Equal | Exists
    value: str = ""
    effect: str = ""  # "" tolerates every effect

    def tolerates(self, taint: Taint) -> bool:
        """core/v1 Toleration.ToleratesTaint."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        if self.operator in ("Equal", ""):
            return self.value == taint.value
        return False

    def manifest(self) -> dict[str, str]:
        out = {"operator": self.operator}
        if self.key:
            out["key"] = self.key
        if self.value and self.operator != "Exists":
            out["value"] = self.value
        if self.effect:
            out["effect"] = self.effect
        return out


def untolerated(taints: Iterable[Taint], tolerations: Iterable[Toleration]) -> Taint | None:
    """The first NoSchedule/NoExecute taint no toleration tolerates (FindMatchingUntoleratedTaint
    with IsSchedulingTaint as the filter), or None."""
    tols = tuple(tolerations)
    for taint in taints:
        if taint.effect not in ("NoSchedule", "NoExecute"):
            continue
        if not any(t.tolerates(taint) for t in tols):
            return taint
    return None


def fits_count(requests: Res, free: Res) -> tuple[int, str]:
    """How many pods of `requests` fit in `free`, and the limiting resource (the one giving
    the fewest; ties broken alphabetically): resources.CountInWithLimitingResource."""
    best: int | None = None
    limiting = ""
    for name in sorted(requests):
        need = requests[name]
        if need <= 0:
            continue
        count = max(0, free.get(name, 0)) // need
        if best is None or count < best:
            best, limiting = count, name
    return (best if best is not None else 1 << 30), limiting


def add_into(target: dict[str, int], other: Res, sign: int = 1) -> None:
    for name, value in other.items():
        target[name] = target.get(name, 0) + sign * value


def matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())
