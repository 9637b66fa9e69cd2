"""Parse core/v1 Nodes, Pods and Events into `objects` types, and the safe field access both
parsers share.

The API server hands us JSON-shaped dicts, but a dump file or a buggy client can put a list
where an object belongs, or a number where a string does. Every helper here returns the field's
default when it is absent and appends a note when it has the wrong shape, so one malformed
object never stops a relist of 50,000 Pods. Parsers take an optional `problems` list to collect
those notes; without one they log them.

The Pod parser is on the startup path (one call per Pod in the cluster), so the helpers test
`type(x) is dict` before falling back to the slower `isinstance` checks.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from fractions import Fraction
from functools import lru_cache
from types import MappingProxyType
from typing import Any, Final

from exporter.cluster.objects import (
    GPU_RESOURCE,
    EfaFinding,
    KubeEvent,
    Node,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    Pod,
    Resources,
    Taint,
    Toleration,
    amount_of,
)
from exporter.core.findings import FINDINGS_ANNOTATION, HEALTH_CONDITION, Finding
from exporter.core.ultraserver import FABRIC_ANNOTATION, NodeFabric
from exporter.topology.labels import (
    DEEP_HEALTH_CHECK_KEY,
    DEEP_HEALTH_PASSED,
    DEEP_HEALTH_UNAVAILABLE,
    HEALTH_STATUS_KEY,
    PROVIDER_ID_PREFIX,
)

log = logging.getLogger(__name__)

EMPTY: Final[Mapping[str, Any]] = MappingProxyType({})

HEALTH_LABEL: Final = HEALTH_STATUS_KEY
WORKLOAD_ANNOTATION: Final = "kueue.x-k8s.io/workload"
JOB_UID_LABEL: Final = "kueue.x-k8s.io/job-uid"
QUEUE_NAME_LABEL: Final = "kueue.x-k8s.io/queue-name"


# --- safe field access -------------------------------------------------------------------


def type_name(value: object) -> str:
    """The JSON name of a value's type, for problem notes."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, list | tuple):
        return "list"
    return type(value).__name__


def mapping(value: object, path: str, problems: list[str]) -> Mapping[str, Any]:
    """`value` if it is an object; empty when absent; empty plus a note when mis-typed."""
    if type(value) is dict:
        return value
    if value is None:
        return EMPTY
    if isinstance(value, Mapping):
        return value
    problems.append(f"{path}: expected an object, got {type_name(value)}")
    return EMPTY


def items(value: object, path: str, problems: list[str]) -> Sequence[Any]:
    """`value` if it is a list; empty when absent; empty plus a note when mis-typed."""
    if type(value) is list:
        return value
    if value is None:
        return ()
    if isinstance(value, tuple):
        return value
    problems.append(f"{path}: expected a list, got {type_name(value)}")
    return ()


def text(value: object, path: str, problems: list[str], default: str = "") -> str:
    """`value` if it is a string; `default` when absent; `default` plus a note otherwise."""
    if type(value) is str:
        return value
    if value is None:
        return default
    if isinstance(value, str):
        return str(value)
    problems.append(f"{path}: expected a string, got {type_name(value)}")
    return default


def integer(value: object, path: str, problems: list[str], default: int = 0) -> int:
    """`value` as an int; whole floats and digit strings are accepted with a note."""
    if type(value) is int:
        return value
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"[+-]?\d{1,18}", value.strip()):
        problems.append(f"{path}: expected an integer, got string {value!r} (used)")
        return int(value)
    problems.append(f"{path}: expected an integer, got {type_name(value)} {value!r:.40}")
    return default


def flag(value: object, path: str, problems: list[str], default: bool) -> bool:
    """`value` if it is a boolean; `default` when absent; `default` plus a note otherwise."""
    if value is True or value is False:
        return value
    if value is None:
        return default
    problems.append(f"{path}: expected a boolean, got {type_name(value)}")
    return default


_ONLY_STR: Final = {str}


def string_map(value: object, path: str, problems: list[str]) -> dict[str, str]:
    """A labels/annotations/nodeSelector map; entries that are not string to string are dropped."""
    raw = mapping(value, path, problems)
    if not raw:
        return {}
    # Every key and value a string (nearly always): one type test per side, in C.
    if {*map(type, raw), *map(type, raw.values())} == _ONLY_STR:
        return dict(raw)
    result: dict[str, str] = {}
    for key, val in raw.items():
        if type(key) is str and type(val) is str:
            result[key] = val
        else:
            problems.append(f"{path}[{key!r}]: expected a string value, got {type_name(val)}")
    return result


def report(kind: str, obj: object, notes: list[str], problems: list[str] | None) -> None:
    """Hand `notes` to the caller's `problems` list, or log them when the caller gave none."""
    if not notes:
        return
    if problems is not None:
        problems.extend(notes)
        return
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    name = meta.get("name") if isinstance(meta, Mapping) else None
    namespace = meta.get("namespace") if isinstance(meta, Mapping) else None
    where = f"{namespace}/{name}" if namespace else str(name)
    log.warning("malformed %s %s: %s", kind, where, "; ".join(notes))


# --- quantities and times ----------------------------------------------------------------

_SUFFIX_FACTOR: Final[Mapping[str, float]] = {
    "n": 1e-9,
    "u": 1e-6,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
    "Pi": 2.0**50,
    "Ei": 2.0**60,
}
# The grammar of resource.Quantity, as the CRDs' `pattern` spells it.
_QUANTITY = re.compile(
    r"([+-]?(?:\d+(?:\.\d*)?|\.\d+))"
    r"(?:(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)|[eE]([+-]?(?:\d+(?:\.\d*)?|\.\d+)))?"
)


def parse_quantity(value: str | int | float) -> float:
    """A Kubernetes quantity ("8", "500m", "1Ki", "2e3", 4) as a number.

    Raises ValueError naming the value when it is not a quantity: callers turn that into a
    problem note rather than guess.
    """
    if isinstance(value, bool):
        raise ValueError(f"quantity must be a number or a string, got boolean {value}")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise ValueError(f"quantity {value!r} is not finite")
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"quantity must be a number or a string, got {type_name(value)}")
    match = _QUANTITY.fullmatch(value.strip())
    if match is None:
        raise ValueError(f"{value!r} is not a Kubernetes quantity")
    number, suffix, exponent = match.groups()
    scale = _SUFFIX_FACTOR[suffix] if suffix else 1.0
    if exponent is not None:
        try:
            scale = math.pow(10.0, float(exponent))
        except OverflowError:
            raise ValueError(f"quantity {value!r} is out of range") from None
    amount = float(number) * scale
    if not math.isfinite(amount):
        raise ValueError(f"quantity {value!r} is out of range")
    return amount


def gpu_count(value: object, path: str, problems: list[str]) -> int:
    """A GPU quantity as a whole number of GPUs (0 when absent or malformed, with a note)."""
    if type(value) is int and value >= 0:
        return value
    if value is None:
        return 0
    if type(value) is str and value.isdigit():
        return int(value)
    try:
        amount = parse_quantity(value)  # type: ignore[arg-type]
    except ValueError as exc:
        problems.append(f"{path}: {exc}")
        return 0
    if amount < 0:
        problems.append(f"{path}: negative GPU quantity {value!r}")
        return 0
    if not amount.is_integer():
        problems.append(f"{path}: {value!r} is not a whole number of GPUs (rounded down)")
    return int(amount)


# Kueue's quota arithmetic is integer (pkg/resources Amount): AmountFromQuantity takes
# Quantity.MilliValue() for cpu and Quantity.Value() for every other resource, both rounded up.
# Parsed exactly here (a float makes 0.1 CPU 100.00000000000001 millicores, then 101).
_EXACT_QUANTITY = re.compile(
    r"([+-]?)(\d+(?:\.\d*)?|\.\d+)(?:(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])|[eE]([+-]?\d+))?"
)
_DECIMAL_EXPONENT: Final[Mapping[str, int]] = {
    "n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18,
}  # fmt: skip
_BINARY_EXPONENT: Final[Mapping[str, int]] = {
    "Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60,
}  # fmt: skip
_MAX_QUOTA_EXPONENT: Final = 40  # exponents past 1e±40 are refused, not computed
MILLI_RESOURCES: Final = frozenset({"cpu"})  # corev1.ResourceCPU, counted in millicores


def quota_amount(resource: str, value: object) -> int:
    """A quota quantity as Kueue counts it: millicores for cpu, whole units (rounded up) else.

    Follows AmountFromQuantity in Kueue's pkg/resources/amount.go. Negative quantities are
    returned as they are (the caller decides); raises ValueError naming the value when it is
    not a Kubernetes quantity.
    """
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"expected a quantity, got {type_name(value)} {value!r:.40}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"quantity {value!r} is not finite")
    match = _EXACT_QUANTITY.fullmatch(str(value).strip())
    if match is None:
        raise ValueError(f"{value!r:.40} is not a Kubernetes quantity")
    sign, number, suffix, exponent = match.groups()
    amount = Fraction(number)
    if suffix in _BINARY_EXPONENT:
        amount *= 2 ** _BINARY_EXPONENT[suffix]
    else:
        power = int(exponent) if exponent is not None else _DECIMAL_EXPONENT[suffix or ""]
        if abs(power) > _MAX_QUOTA_EXPONENT:
            raise ValueError(f"quantity {value!r:.40} is out of range")
        amount *= Fraction(10) ** power
    if resource in MILLI_RESOURCES:
        amount *= 1000
    whole = math.ceil(amount)
    return -whole if sign == "-" else whole


@lru_cache(maxsize=4096)
def _cached_amount(resource: str, value: str) -> int:
    return quota_amount(resource, value)


def resource_amount(resource: str, value: object, path: str, problems: list[str]) -> int | None:
    """One entry of a requests, limits or allocatable map in Kueue's units (`quota_amount`);
    None, with a note naming the field, when it is not a quantity or is negative. Pods and
    Nodes repeat a handful of values, so strings are parsed once each."""
    if type(value) is str:
        if value.isdigit():
            number = int(value)
            return number * 1000 if resource in MILLI_RESOURCES else number
        try:
            amount = _cached_amount(resource, value)
        except ValueError as exc:
            problems.append(f"{path}[{resource!r}]: {exc}")
            return None
    elif type(value) is int:
        amount = value * 1000 if resource in MILLI_RESOURCES else value
    else:
        try:
            amount = quota_amount(resource, value)
        except ValueError as exc:
            problems.append(f"{path}[{resource!r}]: {exc}")
            return None
    if amount < 0:
        problems.append(f"{path}[{resource!r}]: negative quantity {value!r:.40} (ignored)")
        return None
    return amount


def resource_list(raw: object, path: str, problems: list[str]) -> dict[str, int]:
    """A core/v1 ResourceList (requests, limits, allocatable, overhead) in Kueue's units.

    nvidia.com/gpu keeps `gpu_count`'s rule (whole GPUs, rounded down with a note), so a
    pod's GPUs read the same here as everywhere else; an entry that is not a quantity is left
    out with a note, never guessed."""
    return dict(resource_tuple(raw, path, problems))


def resource_tuple(raw: object, path: str, problems: list[str]) -> Resources:
    """`resource_list` as a sorted tuple. Nodes and Workloads repeat a few lists: each is
    parsed once (only parses that left no note are kept)."""
    if type(raw) is dict:
        if not raw:
            return ()
        key: tuple[Any, ...] | None = tuple(raw.items())
        try:
            found = _LIST_CACHE.get(key)  # type: ignore[arg-type]
        except TypeError:  # an unhashable value: parsed (and noted) below
            key, found = None, None
        if found is not None:
            return found
    else:
        key = None
    fields = mapping(raw, path, problems)
    if not fields:
        return ()
    notes: list[str] = []
    out = tuple(sorted(_resource_list(fields, path, notes).items()))
    if notes:
        problems.extend(notes)
    elif key is not None:
        if len(_LIST_CACHE) >= _CONTAINER_CACHE_MAX:
            _LIST_CACHE.clear()
        _LIST_CACHE[key] = out
    return out


_LIST_CACHE: dict[tuple[Any, ...], tuple[tuple[str, int], ...]] = {}


def _resource_list(fields: Mapping[str, Any], path: str, problems: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, value in fields.items():
        if type(name) is not str or not name:
            problems.append(f"{path}: resource name {name!r:.40} is not a string (ignored)")
            continue
        if name == GPU_RESOURCE:  # noted at the container's resources, as ever
            where = path.removesuffix(".requests").removesuffix(".limits")
            out[name] = gpu_count(value, where, problems)
            continue
        amount = resource_amount(name, value, path, problems)
        if amount is not None:
            out[name] = amount
    return out


# Containers' resources as parsed, by their raw (requests, limits) items: pods repeat a few
# shapes, and this runs for every Pod event. Only parses that left no note are kept.
_CONTAINER_CACHE: dict[tuple[Any, Any], tuple[tuple[str, int], ...]] = {}
_CONTAINER_CACHE_MAX: Final = 4096


def _container_requests(
    container: object, where: str, index: int, problems: list[str]
) -> tuple[tuple[str, int], ...]:
    """One container's requests (`where`[`index`]), each resource without a request taking
    its limit (the API server's defaulting, core/v1 SetDefaults_Pod: "If Requests is omitted
    for a container, it defaults to Limits if that is explicitly specified"). Amounts of 0
    are left out. Its path is spelled out only for a note."""
    key: tuple[Any, Any] | None = None
    if type(container) is dict:
        resources = container.get("resources")
        if not resources:
            return ()
        if type(resources) is dict:
            raw_requests = resources.get("requests")
            raw_limits = resources.get("limits")
            if (raw_requests is None or type(raw_requests) is dict) and (
                raw_limits is None or type(raw_limits) is dict
            ):
                key = (
                    tuple(raw_requests.items()) if raw_requests else (),
                    tuple(raw_limits.items()) if raw_limits else (),
                )
                try:
                    found = _CONTAINER_CACHE.get(key)
                except TypeError:  # an unhashable value: parsed (and noted) below
                    key, found = None, None
                if found is not None:
                    return found
    path = f"{where}[{index}]"
    notes: list[str] = []
    fields = mapping(container, path, notes)
    resources = mapping(fields.get("resources"), path + ".resources", notes)
    if not resources:
        problems.extend(notes)
        return ()
    raw_limits = resources.get("limits")
    requests = resource_list(resources.get("requests"), path + ".resources.requests", notes)
    if raw_limits:
        limits = resource_list(raw_limits, path + ".resources.limits", notes)
        for name, amount in limits.items():
            if name not in requests:
                requests[name] = amount
    parsed = tuple(sorted((name, amount) for name, amount in requests.items() if amount > 0))
    if notes:
        problems.extend(notes)
    elif key is not None:
        if len(_CONTAINER_CACHE) >= _CONTAINER_CACHE_MAX:
            _CONTAINER_CACHE.clear()
        _CONTAINER_CACHE[key] = parsed
    return parsed


def pod_spec_requests(spec: Mapping[str, Any], path: str, problems: list[str]) -> Resources:
    """Every resource one Pod with this spec asks the scheduler for, Kueue's units.

    Per resource, the Kubernetes effective-request rule (k8s.io/component-helpers resource
    PodRequests, which Kueue's resources.NewRequestsFromPodSpec follows): the sum over the
    app containers and the sidecars (restartable init containers), or the largest ordinary
    init container plus the sidecars started before it, whichever is more; plus
    spec.overhead (the RuntimeClass's pod overhead)."""
    containers = items(spec.get("containers"), path + ".containers", problems)
    inits = spec.get("initContainers")
    overhead = spec.get("overhead")
    where = path + ".containers"
    if len(containers) == 1 and not inits and not overhead:  # the common pod: one container
        return _container_requests(containers[0], where, 0, problems)  # sorted, positive
    total: dict[str, int] = {}
    for i, container in enumerate(containers):
        for name, amount in _container_requests(container, where, i, problems):
            total[name] = total.get(name, 0) + amount
    if inits:
        sidecars: dict[str, int] = {}
        peak: dict[str, int] = {}
        for i, container in enumerate(items(inits, path + ".initContainers", problems)):
            asked = dict(_container_requests(container, path + ".initContainers", i, problems))
            if isinstance(container, Mapping) and container.get("restartPolicy") == "Always":
                for name, amount in asked.items():
                    sidecars[name] = sidecars.get(name, 0) + amount
            else:
                for name in set(asked) | set(sidecars):
                    alone = sidecars.get(name, 0) + asked.get(name, 0)
                    if alone > peak.get(name, 0):
                        peak[name] = alone
        for name, amount in sidecars.items():
            total[name] = total.get(name, 0) + amount
        for name, amount in peak.items():
            if amount > total.get(name, 0):
                total[name] = amount
    if overhead:
        for name, amount in resource_list(overhead, path + ".overhead", problems).items():
            total[name] = total.get(name, 0) + amount
    return tuple(sorted((name, amount) for name, amount in total.items() if amount > 0))


# The operators core/v1 defines (Lt/Gt: TaintTolerationComparison, Kubernetes 1.35).
TOLERATION_OPERATORS: Final = frozenset({"", "Equal", "Exists", "Lt", "Gt"})
NODE_SELECTOR_OPERATORS: Final = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})


def node_selector(raw: object, path: str, problems: list[str]) -> tuple[tuple[str, str], ...]:
    """A pod spec's nodeSelector, sorted."""
    return tuple(sorted(string_map(raw, path, problems).items()))


def _requirements(
    raw: object, path: str, problems: list[str]
) -> tuple[NodeSelectorRequirement, ...]:
    out = []
    for i, entry in enumerate(items(raw, path, problems)):
        where = f"{path}[{i}]"
        fields = mapping(entry, where, problems)
        key = text(fields.get("key"), where + ".key", problems)
        operator = text(fields.get("operator"), where + ".operator", problems)
        values = tuple(
            v for v in items(fields.get("values"), where + ".values", problems) if type(v) is str
        )
        if operator not in NODE_SELECTOR_OPERATORS:
            problems.append(
                f"{where}.operator {operator!r:.40} is not one of In, NotIn, Exists,"
                " DoesNotExist, Gt, Lt: the term matches no node (Kueue answers 'invalid"
                " affinity node selectors')"
            )
        out.append(NodeSelectorRequirement(key, operator, values))
    return tuple(out)


def required_affinity(raw: object, path: str, problems: list[str]) -> tuple[NodeSelectorTerm, ...]:
    """A pod spec's affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution
    terms, () when none (preferred terms do not exclude nodes)."""
    affinity = mapping(raw, path, problems)
    if not affinity:
        return ()
    node = mapping(affinity.get("nodeAffinity"), path + ".nodeAffinity", problems)
    where = path + ".nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    required = mapping(node.get("requiredDuringSchedulingIgnoredDuringExecution"), where, problems)
    terms = []
    for i, term in enumerate(
        items(required.get("nodeSelectorTerms"), where + ".nodeSelectorTerms", problems)
    ):
        at = f"{where}.nodeSelectorTerms[{i}]"
        fields = mapping(term, at, problems)
        terms.append(
            NodeSelectorTerm(
                _requirements(fields.get("matchExpressions"), at + ".matchExpressions", problems),
                _requirements(fields.get("matchFields"), at + ".matchFields", problems),
            )
        )
    return tuple(terms)


@lru_cache(maxsize=8192)
def _parse_rfc3339(stamp: str) -> float | None:
    try:
        moment = datetime.fromisoformat(stamp)
    except ValueError:
        try:
            moment = datetime.fromisoformat(stamp.upper())  # RFC 3339 allows "t" and "z"
        except ValueError:
            return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def parse_time(value: object) -> float | None:
    """An RFC 3339 time (with or without fractional seconds, "Z" or an offset) as Unix seconds.

    Also takes a datetime (what the `kubernetes` client deserializes to) or a number of Unix
    seconds. Anything else, including an unparsable string, is None.
    """
    if isinstance(value, str):
        return _parse_rfc3339(value.strip()) if value else None
    if isinstance(value, datetime):
        moment = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        return moment.timestamp()
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


# --- pod specs and owners (shared with Workload pod templates) ----------------------------


def _container_gpus(container: object, path: str, problems: list[str]) -> int:
    fields = mapping(container, path, problems)
    resources = mapping(fields.get("resources"), path + ".resources", problems)
    if not resources:
        return 0
    requests = mapping(resources.get("requests"), path + ".resources.requests", problems)
    amount = requests.get(GPU_RESOURCE)
    if amount is None:  # Kubernetes defaults an extended resource's request to its limit
        limits = mapping(resources.get("limits"), path + ".resources.limits", problems)
        amount = limits.get(GPU_RESOURCE)
    return gpu_count(amount, path + ".resources", problems)


def pod_spec_gpus(spec: Mapping[str, Any], path: str, problems: list[str]) -> int:
    """GPUs one Pod with this spec asks the scheduler for.

    That is the sum over the app containers and the sidecars (restartable init containers),
    or the largest ordinary init container plus the sidecars started before it, whichever is
    more: the Kubernetes effective-request rule.
    """
    total = 0
    for i, container in enumerate(items(spec.get("containers"), path + ".containers", problems)):
        total += _container_gpus(container, f"{path}.containers[{i}]", problems)
    inits = spec.get("initContainers")
    if not inits:
        return total
    sidecars = 0
    peak = 0
    for i, container in enumerate(items(inits, path + ".initContainers", problems)):
        gpus = _container_gpus(container, f"{path}.initContainers[{i}]", problems)
        if isinstance(container, Mapping) and container.get("restartPolicy") == "Always":
            sidecars += gpus
        else:
            peak = max(peak, sidecars + gpus)
    return max(total + sidecars, peak)


def controlling_owner(meta: Mapping[str, Any], problems: list[str]) -> tuple[str, str]:
    """("Kind/name", uid) of the controller ownerReference, else of the first one."""
    refs = (
        v
        if type(v := meta.get("ownerReferences")) is list
        else items(v, "metadata.ownerReferences", problems)
    )
    if not refs:
        return "", ""
    chosen: Mapping[str, Any] = EMPTY
    for ref in refs:
        if (type(ref) is dict or isinstance(ref, Mapping)) and ref.get("controller") is True:
            chosen = ref
            break
    else:
        chosen = mapping(refs[0], "metadata.ownerReferences[0]", problems)
    path = "metadata.ownerReferences[]"  # (type-tested in line: this runs for every Pod event)
    kind = v if type(v := chosen.get("kind")) is str else text(v, path + ".kind", problems)
    name = v if type(v := chosen.get("name")) is str else text(v, path + ".name", problems)
    uid = v if type(v := chosen.get("uid")) is str else text(v, path + ".uid", problems)
    return (f"{kind}/{name}" if kind or name else ""), uid


def taints(raw: object, path: str, problems: list[str]) -> tuple[Taint, ...]:
    """A core/v1 taint list (Node spec.taints, ResourceFlavor spec.nodeTaints).

    An entry without a key or an effect is dropped with a note: the API server requires both.
    """
    result = []
    for i, entry in enumerate(items(raw, path, problems)):
        where = f"{path}[{i}]"
        fields = mapping(entry, where, problems)
        key = text(fields.get("key"), where + ".key", problems)
        effect = text(fields.get("effect"), where + ".effect", problems)
        if not key or not effect:
            problems.append(f"{where}: a taint needs a key and an effect (ignored)")
            continue
        result.append(Taint(key, text(fields.get("value"), where + ".value", problems), effect))
    return tuple(result)


def tolerations(raw: object, path: str, problems: list[str]) -> tuple[Toleration, ...]:
    """A core/v1 toleration list (ResourceFlavor spec.tolerations, a pod spec's tolerations)."""
    result = []
    for i, entry in enumerate(items(raw, path, problems)):
        where = f"{path}[{i}]"
        fields = mapping(entry, where, problems)
        if not fields:
            continue
        toleration = Toleration(
            key=text(fields.get("key"), where + ".key", problems),
            operator=text(fields.get("operator"), where + ".operator", problems),
            value=text(fields.get("value"), where + ".value", problems),
            effect=text(fields.get("effect"), where + ".effect", problems),
        )
        if toleration.operator not in TOLERATION_OPERATORS:
            problems.append(
                f"{where}.operator {toleration.operator!r:.40} is not Equal, Exists, Lt or Gt:"
                " this toleration tolerates no taint (core/v1 Toleration.ToleratesTaint)"
            )
        result.append(toleration)
    return tuple(result)


def object_parts(obj: object, problems: list[str]) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """(the object, its metadata), each empty with a note when missing or mis-shaped."""
    if type(obj) is not dict and not isinstance(obj, Mapping):
        problems.append(f"expected an API object, got {type_name(obj)}")
        return EMPTY, EMPTY
    meta = mapping(obj.get("metadata"), "metadata", problems)
    if not meta:
        problems.append("metadata missing")
    return obj, meta


# --- Node, Pod, Event --------------------------------------------------------------------


def parse_node(obj: Mapping[str, Any], problems: list[str] | None = None) -> Node:
    """A Node: its labels, allocatable resources (GPUs and every other, Kueue's units), and
    whether new Pods can land on it.

    Schedulable means not cordoned, Ready, and not marked Unschedulable* by HyperPod's health
    agent (which labels a node before it taints or replaces it).
    """
    notes: list[str] = []
    try:  # (type-tested in line, as `parse_pod` does: this runs for every Node event)
        body, meta = object_parts(obj, notes)
        labels = string_map(meta.get("labels"), "metadata.labels", notes)
        spec = v if type(v := body.get("spec")) is dict else mapping(v, "spec", notes)
        status = v if type(v := body.get("status")) is dict else mapping(v, "status", notes)
        allocatable = resource_tuple(status.get("allocatable"), "status.allocatable", notes)
        gpus = amount_of(allocatable, GPU_RESOURCE)
        ready = False
        condition_note = ""
        conditions = status.get("conditions")
        if type(conditions) is not list:
            conditions = items(conditions, "status.conditions", notes)
        for cond in conditions:
            if type(cond) is not dict and not isinstance(cond, Mapping):
                continue
            kind = cond.get("type")
            if kind == "Ready":
                ready = cond.get("status") == "True"
            elif kind == HEALTH_CONDITION:
                condition_note = _unhealthy_note(cond)
        cordoned = flag(spec.get("unschedulable"), "spec.unschedulable", notes, False)
        health = labels.get(HEALTH_LABEL, "")
        annotations = (
            v
            if type(v := meta.get("annotations")) is dict
            else mapping(v, "metadata.annotations", notes)
        )
        efa, findings_read = efa_findings(annotations.get(FINDINGS_ANNOTATION), notes)
        deep_health = labels.get(DEEP_HEALTH_CHECK_KEY, "")
        deep_health_blocks = deep_health in DEEP_HEALTH_UNAVAILABLE
        if deep_health and not deep_health_blocks and deep_health != DEEP_HEALTH_PASSED:
            # Unreadable: not counted free, since a check may be running.
            notes.append(f"unknown {DEEP_HEALTH_CHECK_KEY} value {deep_health[:64]!r}")
            deep_health_blocks = True
        node = Node(
            name=v if type(v := meta.get("name")) is str else text(v, "metadata.name", notes),
            labels=tuple(sorted(labels.items())),
            allocatable_gpus=gpus,
            schedulable=ready and not cordoned and not health.startswith("Unschedulable"),
            health=health,
            condition_note=condition_note,
            taints=() if (v := spec.get("taints")) is None else taints(v, "spec.taints", notes),
            cordoned=cordoned,
            ready=ready,
            deep_health=deep_health,
            deep_health_blocks=deep_health_blocks,
            instance_id=instance_id_of(spec.get("providerID")),
            efa_findings=efa,
            findings_read=findings_read,
            allocatable=allocatable,
            fabric=node_fabric(annotations.get(FABRIC_ANNOTATION), notes),
        )
    except Exception as exc:  # a parser bug must not take the informer down
        notes.append(f"unexpected {type(exc).__name__}: {exc}")
        node = Node(
            name="", labels=(), allocatable_gpus=0, schedulable=False, health="", ready=False
        )
    if notes:
        report("Node", obj, notes, problems)
    return node


def efa_findings(raw: object, notes: list[str]) -> tuple[tuple[EfaFinding, ...], bool]:
    """The EFA findings (`efa_*` checks) of a `topowatch.io/findings` annotation, and whether
    the annotation could be read: absent, empty, not JSON or not a list is (), False. An entry
    that is not a valid finding is skipped and the others kept; each problem is a note that
    starts with the annotation's key. Never raises."""
    if raw is None:
        return (), False
    if not isinstance(raw, str):
        notes.append(f"{FINDINGS_ANNOTATION}: expected a string, got {type_name(raw)}")
        return (), False
    if not raw.strip():
        return (), False
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        notes.append(f"{FINDINGS_ANNOTATION}: not JSON ({type(exc).__name__}: {exc})"[:300])
        return (), False
    if not isinstance(data, list):
        notes.append(f"{FINDINGS_ANNOTATION}: expected a JSON list, got {type_name(data)}")
        return (), False
    out: list[EfaFinding] = []
    for i, entry in enumerate(data):
        try:
            finding = Finding.from_dict(entry)
        except (ValueError, OverflowError) as exc:  # FindingsFormatError, a time out of range
            notes.append(f"{FINDINGS_ANNOTATION}: finding [{i}]: {exc}"[:300])
            continue
        if finding.check.startswith("efa_"):
            out.append(
                EfaFinding(
                    finding.check,
                    finding.component,
                    finding.first_seen,
                    finding.last_seen,
                    finding.action,
                    finding.evidence,
                )
            )
    return tuple(out), True


def node_fabric(raw: object, notes: list[str]) -> NodeFabric | None:
    """The node agent's `topowatch.io/nvlink-fabric` summary; None when absent, or unreadable
    (with a note starting with the annotation's key). Never raises."""
    if raw is None:
        return None
    try:
        return NodeFabric.from_json(raw)
    except ValueError as exc:
        notes.append(f"{FABRIC_ANNOTATION}: {exc}"[:300])
        return None


def instance_id_of(provider_id: object) -> str:
    """The EC2 instance id in a Node's spec.providerID (aws:///us-east-1a/i-0abc...), else ""."""
    if not isinstance(provider_id, str) or not provider_id.startswith(PROVIDER_ID_PREFIX):
        return ""
    last = provider_id.rsplit("/", 1)[-1]
    return last if last.startswith("i-") else ""


def _unhealthy_note(cond: Mapping[str, Any]) -> str:
    """What our node agent's condition says when it is False, "" otherwise."""
    if cond.get("status") != "False":
        return ""
    detail = ": ".join(str(cond.get(k)) for k in ("reason", "message") if cond.get(k))
    return f"{HEALTH_CONDITION}=False" + (f" ({detail})" if detail else "")


def parse_pod(obj: Mapping[str, Any], problems: list[str] | None = None) -> Pod:
    """A Pod: where it runs, how many GPUs it holds, and which Kueue workload it belongs to.

    This runs for every Pod event, so each field is type-tested in line and the checked
    helpers (`mapping`, `text`, which write the notes) run only for a field that fails the test:
    the same Pod and the same notes, in the same order, as calling them for every field."""
    notes: list[str] = []
    try:
        body, meta = object_parts(obj, notes)
        get = meta.get
        spec = v if type(v := body.get("spec")) is dict else mapping(v, "spec", notes)
        status = v if type(v := body.get("status")) is dict else mapping(v, "status", notes)
        labels = v if type(v := get("labels")) is dict else mapping(v, "metadata.labels", notes)
        annotations = (
            v
            if type(v := get("annotations")) is dict
            else mapping(v, "metadata.annotations", notes)
        )
        owner, owner_uid = controlling_owner(meta, notes)
        namespace = (
            v if type(v := get("namespace")) is str else text(v, "metadata.namespace", notes)
        )
        name = v if type(v := get("name")) is str else text(v, "metadata.name", notes)
        uid = v if type(v := get("uid")) is str else text(v, "metadata.uid", notes)
        node = v if type(v := spec.get("nodeName")) is str else text(v, "spec.nodeName", notes)
        phase = v if type(v := status.get("phase")) is str else text(v, "status.phase", notes)
        # every resource, read where the GPUs were, so notes keep their order
        requests = pod_spec_requests(spec, "spec", notes)
        workload = (
            v
            if type(v := annotations.get(WORKLOAD_ANNOTATION)) is str
            else text(v, "metadata.annotations", notes)
        )
        job_uid = (
            v if type(v := labels.get(JOB_UID_LABEL)) is str else text(v, "metadata.labels", notes)
        )
        queue_name = (
            v
            if type(v := labels.get(QUEUE_NAME_LABEL)) is str
            else text(v, "metadata.labels", notes)
        )
        conditions = status.get("conditions")
        gates = spec.get("schedulingGates")
        pod = Pod(
            namespace,
            name,
            uid,
            node,
            phase,
            amount_of(requests, GPU_RESOURCE),
            workload,
            job_uid,
            queue_name,
            owner,
            owner_uid,
            None if conditions is None else _ready_since(conditions, notes),
            bool(gates)
            if type(gates) is list
            else bool(items(gates, "spec.schedulingGates", notes)),
            requests,
        )
    except Exception as exc:  # a parser bug must not take the informer down
        notes.append(f"unexpected {type(exc).__name__}: {exc}")
        pod = Pod("", "", "", "", "", 0, "", "", "", "", "")
    if notes:
        report("Pod", obj, notes, problems)
    return pod


def _ready_since(raw: object, notes: list[str]) -> float | None:
    """When the Pod's Ready condition turned True (its creation-less fallback is 0.0), None
    while it is not Ready."""
    for cond in items(raw, "status.conditions", notes):
        if isinstance(cond, Mapping) and cond.get("type") == "Ready":
            if cond.get("status") != "True":
                return None
            return parse_time(cond.get("lastTransitionTime")) or 0.0
    return None


def parse_event(obj: Mapping[str, Any], problems: list[str] | None = None) -> KubeEvent:
    """A core/v1 Event (events.k8s.io/v1 field names are read too).

    Events from the new recorder leave count, firstTimestamp and lastTimestamp empty and carry
    eventTime and series instead, so the times fall back along that chain and finally to the
    object's creation time.
    """
    notes: list[str] = []
    try:
        body, meta = object_parts(obj, notes)
        involved = body.get("involvedObject", body.get("regarding"))
        target = mapping(involved, "involvedObject", notes)
        series = mapping(body.get("series"), "series", notes)
        count = integer(body.get("count", body.get("deprecatedCount")), "count", notes)
        if count <= 0:
            count = integer(series.get("count"), "series.count", notes) or 1
        event_time = parse_time(body.get("eventTime"))
        created = parse_time(meta.get("creationTimestamp"))
        first = parse_time(body.get("firstTimestamp", body.get("deprecatedFirstTimestamp")))
        last = parse_time(body.get("lastTimestamp", body.get("deprecatedLastTimestamp")))
        if first is None:
            first = event_time if event_time is not None else created
        if last is None:
            last = parse_time(series.get("lastObservedTime"))
        if last is None:
            last = event_time if event_time is not None else first
        message = body.get("message", body.get("note"))
        event = KubeEvent(
            namespace=text(meta.get("namespace"), "metadata.namespace", notes),
            name=text(meta.get("name"), "metadata.name", notes),
            uid=text(meta.get("uid"), "metadata.uid", notes),
            involved_kind=text(target.get("kind"), "involvedObject.kind", notes),
            involved_namespace=text(target.get("namespace"), "involvedObject.namespace", notes),
            involved_name=text(target.get("name"), "involvedObject.name", notes),
            involved_uid=text(target.get("uid"), "involvedObject.uid", notes),
            reason=text(body.get("reason"), "reason", notes),
            message=text(message, "message", notes),
            type=text(body.get("type"), "type", notes),
            count=count,
            first_seen=first,
            last_seen=last,
        )
    except Exception as exc:  # a parser bug must not take the informer down
        notes.append(f"unexpected {type(exc).__name__}: {exc}")
        event = KubeEvent("", "", "", "", "", "", "", "", "", "", 1, None, None)
    report("Event", obj, notes, problems)
    return event
