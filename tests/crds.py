"""Validate Kueue objects against the real Kueue CRD schemas, as strictly as the API server.

HyperPodPyTorchJobs (sagemaker.amazonaws.com) are validated the same way against our own
reconstruction of their CRD, tests/fixtures/hyperpod/hyperpodpytorchjob-crd.yaml (the operator
is closed source; that file's header says what is known and what is not):
`crd_validator(group, kind, version)` / `assert_valid` take either group.

The API server prunes fields a structural schema does not know, silently. A fixture with a
misspelled field would then test something no cluster ever stores, so here an unknown field
is an error: every object schema that lists `properties` is closed (additionalProperties:
false) unless it keeps unknown fields (x-kubernetes-preserve-unknown-fields) or already says
what extra properties may hold. Top-level `metadata` (an open object in every CRD) is checked
by hand for the basics the API server insists on.

Also enforced: x-kubernetes-int-or-string, nullable, the date-time/int32/int64 formats, and
the uniqueness that x-kubernetes-list-type map/set demands. Not enforced: the CEL rules
(x-kubernetes-validations), defaulting, and immutability — an object passing here can still
be refused by such a rule, so keep fixtures plausible, not just valid.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

import yaml
from jsonschema import FormatChecker, ValidationError, validators
from jsonschema.protocols import Validator

from tests.conftest import reference

Checker = Callable[[Mapping[str, Any]], list[str]]

_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
KUEUE_GROUP = "kueue.x-k8s.io"
HYPERPOD_GROUP = "sagemaker.amazonaws.com"
HYPERPOD_CRD = Path(__file__).parent / "fixtures" / "hyperpod" / "hyperpodpytorchjob-crd.yaml"
_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")


def _load(path: Path) -> Mapping[str, Any]:
    with path.open() as handle:
        crd: Mapping[str, Any] = yaml.load(
            handle, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        )
    return crd


@lru_cache(maxsize=1)
def _crds() -> dict[str, Mapping[str, Any]]:
    """Kind -> CRD, from the reference copy of Kueue's config/components/crd/bases."""
    found: dict[str, Mapping[str, Any]] = {}
    for path in sorted(reference("kueue/crds").glob("*.yaml")):
        crd = _load(path)
        found[crd["spec"]["names"]["kind"]] = crd
    return found


@lru_cache(maxsize=2)
def _group_crds(group: str) -> dict[str, Mapping[str, Any]]:
    """Kind -> CRD for one API group: Kueue's real CRDs, or our HyperPod reconstruction."""
    if group == KUEUE_GROUP:
        return _crds()
    if group == HYPERPOD_GROUP:
        crd = _load(HYPERPOD_CRD)
        return {crd["spec"]["names"]["kind"]: crd}
    raise AssertionError(f"no CRDs known for group {group!r}")


def _strict(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of an OpenAPI v3 schema node that rejects what the API server would prune."""
    node = dict(schema)
    if "properties" in node:
        node["properties"] = {name: _strict(sub) for name, sub in node["properties"].items()}
    for key in ("items", "additionalProperties", "not"):
        if isinstance(node.get(key), Mapping):
            node[key] = _strict(node[key])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in node:
            node[key] = [_strict(sub) for sub in node[key]]
    pattern = node.get("pattern")
    if isinstance(pattern, str) and pattern.startswith("^(?i)"):
        # RE2 (the API server's regexp) takes a flag group anywhere; Python's re only at the
        # start: AdmissionCheck's spec.parameters.kind is "^(?i)[a-z]([-a-z0-9]*[a-z0-9])?$".
        node["pattern"] = "(?i)^" + pattern[len("^(?i)") :]
    if node.get("x-kubernetes-int-or-string") and "anyOf" not in node:
        node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") is True:
        if "type" in node:
            node["type"] = [node["type"], "null"]
        if "enum" in node:
            node["enum"] = [*node["enum"], None]
    if (
        "properties" in node
        and "additionalProperties" not in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        node["additionalProperties"] = False
    return node


def _list_type(
    validator: Validator, list_type: str, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    """x-kubernetes-list-type: a `map` is unique by its keys, a `set` by its items."""
    if not isinstance(instance, list) or list_type not in ("map", "set"):
        return
    seen: set[str] = set()
    keys = schema.get("x-kubernetes-list-map-keys", [])
    for item in instance:
        if list_type == "map" and isinstance(item, Mapping):
            identity = json.dumps([item.get(key) for key in keys])
        else:
            identity = json.dumps(item, sort_keys=True)
        if identity in seen:
            what = f"keys {keys}" if list_type == "map" else "value"
            yield ValidationError(f"duplicate {what} {identity} in a list of type {list_type}")
        seen.add(identity)


def _format_checker() -> FormatChecker:
    checker = FormatChecker(formats=())

    @checker.checks("date-time")
    def _date_time(value: object) -> bool:
        return not isinstance(value, str) or _RFC3339.fullmatch(value) is not None

    @checker.checks("int32")
    def _int32(value: object) -> bool:
        return not isinstance(value, int) or -(2**31) <= value < 2**31

    @checker.checks("int64")
    def _int64(value: object) -> bool:
        return not isinstance(value, int) or -(2**63) <= value < 2**63

    return checker


_KubeValidator = validators.extend(  # type: ignore[no-untyped-call]
    validators.Draft202012Validator, {"x-kubernetes-list-type": _list_type}
)


def _where(error: ValidationError) -> str:
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    return path.lstrip(".") or "(object)"


def _metadata_problems(obj: Mapping[str, Any], crd: Mapping[str, Any], version: str) -> list[str]:
    spec = crd["spec"]
    problems = []
    want_api = f"{spec['group']}/{version}"
    if obj.get("apiVersion") != want_api:
        problems.append(f"apiVersion: {obj.get('apiVersion')!r}, expected {want_api!r}")
    if obj.get("kind") != spec["names"]["kind"]:
        problems.append(f"kind: {obj.get('kind')!r}, expected {spec['names']['kind']!r}")
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        return [*problems, "metadata: missing or not an object"]
    name = meta.get("name")
    if not isinstance(name, str) or len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
        problems.append(f"metadata.name: {name!r} is not a DNS-1123 subdomain")
    namespace = meta.get("namespace")
    if spec["scope"] == "Namespaced":
        if not isinstance(namespace, str) or not _DNS_LABEL.fullmatch(namespace):
            problems.append(f"metadata.namespace: {namespace!r} is not a DNS-1123 label")
    elif namespace is not None:
        problems.append(f"metadata.namespace: set on cluster-scoped {spec['names']['kind']}")
    for field in ("labels", "annotations"):
        values = meta.get(field)
        if values is None:
            continue
        if not isinstance(values, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in values.items()
        ):
            problems.append(f"metadata.{field}: must map strings to strings")
    stamp = meta.get("creationTimestamp")
    if stamp is not None and not (isinstance(stamp, str) and _RFC3339.fullmatch(stamp)):
        problems.append(f"metadata.creationTimestamp: {stamp!r} is not RFC 3339")
    return problems


@cache
def kueue_validator(kind: str, version: str) -> Checker:
    """A function listing every way an object breaks the `kind` CRD's `version` schema."""
    return crd_validator(KUEUE_GROUP, kind, version)


@cache
def crd_validator(group: str, kind: str, version: str) -> Checker:
    """A function listing every way an object breaks `group`'s `kind` CRD, `version` schema."""
    crds = _group_crds(group)
    crd = crds.get(kind)
    if crd is None:
        label = "Kueue" if group == KUEUE_GROUP else group
        raise AssertionError(f"no {label} CRD of kind {kind!r}; known: {sorted(crds)}")
    served = {v["name"]: v for v in crd["spec"]["versions"] if v.get("served")}
    if version not in served:
        raise AssertionError(f"{kind} {version!r} is not served; served: {sorted(served)}")
    schema = _strict(served[version]["schema"]["openAPIV3Schema"])
    validator = _KubeValidator(schema, format_checker=_format_checker())

    def check(obj: Mapping[str, Any]) -> list[str]:
        problems = _metadata_problems(obj, crd, version)
        errors = sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.path)))
        problems.extend(f"{_where(error)}: {error.message}" for error in errors)
        return problems

    return check


def assert_valid_kueue(obj: Mapping[str, Any]) -> None:
    """Raise AssertionError listing every violation of the CRD named by obj's apiVersion/kind."""
    _assert_valid(obj, (KUEUE_GROUP,))


def assert_valid(obj: Mapping[str, Any]) -> None:
    """assert_valid_kueue for a Kueue object or a HyperPodPyTorchJob."""
    _assert_valid(obj, (KUEUE_GROUP, HYPERPOD_GROUP))


def _assert_valid(obj: Mapping[str, Any], groups: tuple[str, ...]) -> None:
    api_version = obj.get("apiVersion")
    kind = obj.get("kind")
    if not isinstance(api_version, str) or "/" not in api_version or not isinstance(kind, str):
        raise AssertionError(f"not a Kueue object: apiVersion={api_version!r}, kind={kind!r}")
    group, version = api_version.split("/", 1)
    if group not in groups:
        raise AssertionError(f"apiVersion {api_version!r} is not in the {groups[0]} group")
    problems = crd_validator(group, kind, version)(obj)
    if problems:
        name = (
            obj.get("metadata", {}).get("name")
            if isinstance(obj.get("metadata"), Mapping)
            else None
        )
        listing = "\n  ".join(problems)
        raise AssertionError(f"{kind} {name!r} ({api_version}) is invalid:\n  {listing}")
