"""Kubernetes label and field selectors, parsed and matched as kube-apiserver does.

Label selectors support `key`, `!key`, `key=v`, `key==v`, `key!=v`, `key in (a,b)`,
`key notin (a,b)`, `key>n` and `key<n`; `!=` and `notin` also match objects without the
label. Field selectors support `=`, `==` and `!=` over the fields each resource declares
(`metadata.name` and `metadata.namespace` everywhere); an unknown field is an error, as
on a real server. A malformed selector raises `SelectorError`, which the server answers
with 400 Bad Request.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?" + _NAME + "$"
)
_LABEL_VALUE = re.compile(r"^(" + _NAME + ")?$")
_TOKEN = re.compile(r"\s*(==|!=|=|!|\(|\)|,|>|<|[^\s=!(),<>]+)")
_MAX_PREFIX = 253


class SelectorError(ValueError):
    """A selector that does not parse, or names a field the resource does not support."""


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: str  # exists | !exists | = | != | in | notin | > | <
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        op = self.operator
        if op == "exists":
            return value is not None
        if op == "!exists":
            return value is None
        if op in ("=", "in"):
            return value is not None and value in self.values
        if op in ("!=", "notin"):
            return value is None or value not in self.values
        if value is None:
            return False
        try:
            number = int(value)
        except ValueError:
            return False
        bound = int(self.values[0])
        return number > bound if op == ">" else number < bound


@dataclass(frozen=True, slots=True)
class LabelSelector:
    requirements: tuple[Requirement, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements


def parse_label_selector(text: str) -> LabelSelector:
    """Parse a label selector string; raise SelectorError when it is malformed."""
    tokens = _tokenize(text)
    requirements: list[Requirement] = []
    pos = 0
    while pos < len(tokens):
        requirement, pos = _requirement(tokens, pos, text)
        requirements.append(requirement)
        if pos < len(tokens):
            if tokens[pos] != ",":
                raise SelectorError(f"unable to parse requirement: found {tokens[pos]!r}")
            pos += 1
            if pos == len(tokens):
                raise SelectorError("unable to parse requirement: found trailing ','")
    return LabelSelector(tuple(requirements))


def _tokenize(text: str) -> list[str]:
    tokens: list[str] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        match = _TOKEN.match(text, pos)
        if match is None:  # pragma: no cover - the pattern accepts any non-space character
            raise SelectorError(f"unable to parse selector {text!r}")
        tokens.append(match.group(1))
        pos = match.end()
    return tokens


def _requirement(tokens: list[str], pos: int, text: str) -> tuple[Requirement, int]:
    if tokens[pos] == "!":
        key = _key(tokens, pos + 1)
        return Requirement(key, "!exists"), pos + 2
    key = _key(tokens, pos)
    pos += 1
    if pos == len(tokens) or tokens[pos] == ",":
        return Requirement(key, "exists"), pos
    op = tokens[pos]
    pos += 1
    if op in ("=", "==", "!="):
        value = ""
        if pos < len(tokens) and tokens[pos] not in (",", "(", ")"):
            value = tokens[pos]
            pos += 1
        return Requirement(key, "!=" if op == "!=" else "=", (_value(value),)), pos
    if op in (">", "<"):
        if pos == len(tokens) or not re.fullmatch(r"-?\d+", tokens[pos]):
            raise SelectorError(f"unable to parse requirement: {op} needs an integer value")
        return Requirement(key, op, (tokens[pos],)), pos + 1
    if op in ("in", "notin"):
        values, pos = _value_set(tokens, pos)
        return Requirement(key, op, values), pos
    raise SelectorError(f"unable to parse requirement: unknown operator {op!r} in {text!r}")


def _value_set(tokens: list[str], pos: int) -> tuple[tuple[str, ...], int]:
    if pos == len(tokens) or tokens[pos] != "(":
        raise SelectorError("unable to parse requirement: expected '(' after in/notin")
    pos += 1
    values: list[str] = []
    expect_value = True
    while pos < len(tokens) and tokens[pos] != ")":
        token = tokens[pos]
        if token == ",":
            if expect_value:
                values.append("")
            expect_value = True
        elif expect_value:
            values.append(_value(token))
            expect_value = False
        else:
            raise SelectorError(f"unable to parse requirement: unexpected {token!r} in set")
        pos += 1
    if pos == len(tokens):
        raise SelectorError("unable to parse requirement: missing ')'")
    if expect_value and values:
        values.append("")
    if not values:
        raise SelectorError(
            "unable to parse requirement: for 'in', 'notin' operators, values set can't be empty"
        )
    return tuple(values), pos + 1


def _key(tokens: list[str], pos: int) -> str:
    if pos >= len(tokens):
        raise SelectorError("unable to parse requirement: missing key")
    key = tokens[pos]
    prefix, _, _ = key.rpartition("/")
    if not _LABEL_KEY.match(key) or len(prefix) > _MAX_PREFIX:
        raise SelectorError(f"unable to parse requirement: invalid label key {key!r}")
    return key


def _value(value: str) -> str:
    if not _LABEL_VALUE.match(value):
        raise SelectorError(f"unable to parse requirement: invalid label value {value!r}")
    return value


# ---- field selectors ----

FieldGetter = Callable[[dict[str, Any]], str]


def _path(*keys: str) -> FieldGetter:
    def get(obj: dict[str, Any]) -> str:
        node: Any = obj
        for key in keys:
            if not isinstance(node, dict):
                return ""
            node = node.get(key)
        if node is None:
            return ""
        if isinstance(node, bool):
            return "true" if node else "false"
        return str(node)

    return get


_COMMON_FIELDS: dict[str, FieldGetter] = {
    "metadata.name": _path("metadata", "name"),
    "metadata.namespace": _path("metadata", "namespace"),
}
_EXTRA_FIELDS: dict[str, dict[str, FieldGetter]] = {
    "pods": {
        "spec.nodeName": _path("spec", "nodeName"),
        "spec.schedulerName": _path("spec", "schedulerName"),
        "spec.serviceAccountName": _path("spec", "serviceAccountName"),
        "spec.hostNetwork": _path("spec", "hostNetwork"),
        "spec.restartPolicy": _path("spec", "restartPolicy"),
        "status.phase": _path("status", "phase"),
        "status.podIP": _path("status", "podIP"),
        "status.nominatedNodeName": _path("status", "nominatedNodeName"),
    },
    "nodes": {"spec.unschedulable": _path("spec", "unschedulable")},
    "namespaces": {"status.phase": _path("status", "phase")},
    "events": {
        **{
            f"involvedObject.{f}": _path("involvedObject", f)
            for f in (
                "kind",
                "namespace",
                "name",
                "uid",
                "apiVersion",
                "resourceVersion",
                "fieldPath",
            )
        },
        "reason": _path("reason"),
        "reportingComponent": _path("reportingComponent"),
        "source": _path("source", "component"),
        "type": _path("type"),
    },
}


@dataclass(frozen=True, slots=True)
class FieldRequirement:
    field: str
    equal: bool
    value: str
    getter: FieldGetter

    def matches(self, obj: dict[str, Any]) -> bool:
        return (self.getter(obj) == self.value) == self.equal


@dataclass(frozen=True, slots=True)
class FieldSelector:
    requirements: tuple[FieldRequirement, ...]

    def matches(self, obj: dict[str, Any]) -> bool:
        return all(r.matches(obj) for r in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements


def parse_field_selector(text: str, plural: str) -> FieldSelector:
    """Parse a field selector for resource `plural`; raise SelectorError when it is invalid."""
    fields = {**_COMMON_FIELDS, **_EXTRA_FIELDS.get(plural, {})}
    requirements: list[FieldRequirement] = []
    for term in _split_unescaped(text, ","):
        if not term.strip():
            continue
        field, equal, raw = _split_term(term)
        getter = fields.get(field)
        if getter is None:
            raise SelectorError(f'field label not supported: "{field}"')
        requirements.append(FieldRequirement(field, equal, _unescape(raw), getter))
    return FieldSelector(tuple(requirements))


def _split_term(term: str) -> tuple[str, bool, str]:
    for op, equal in (("!=", False), ("==", True), ("=", True)):
        index = _find_unescaped(term, op)
        if index >= 0:
            return term[:index].strip(), equal, term[index + len(op) :].strip()
    raise SelectorError(f"invalid selector: {term!r}; can't understand {term!r}")


def _find_unescaped(text: str, needle: str) -> int:
    index = 0
    while index < len(text):
        if text[index] == "\\":
            index += 2
            continue
        if text.startswith(needle, index):
            return index
        index += 1
    return -1


def _split_unescaped(text: str, sep: str) -> list[str]:
    parts: list[str] = []
    start = 0
    while True:
        index = _find_unescaped(text[start:], sep)
        if index < 0:
            parts.append(text[start:])
            return parts
        parts.append(text[start : start + index])
        start += index + len(sep)


def _unescape(value: str) -> str:
    out: list[str] = []
    index = 0
    while index < len(value):
        char = value[index]
        if char == "\\" and index + 1 < len(value):
            out.append(value[index + 1])
            index += 2
            continue
        out.append(char)
        index += 1
    return "".join(out)
