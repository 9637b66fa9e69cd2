"""Metric families and their two wire formats: Prometheus text 0.0.4 and OpenMetrics 1.0.

Why not prometheus_client's `generate_latest`: it costs about 9 µs a sample, and a p5 node
exports roughly 3,000 samples, which alone would blow the agent's 25 ms poll budget. Here a
family's label sets are rendered to strings once while it is built, so encoding is a join.
The formats follow the specs; tests check the output with promtool and with prometheus_client's
OpenMetrics parser.
"""

from __future__ import annotations

import gzip
import math
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"

COUNTER = "counter"
GAUGE = "gauge"
INFO = "info"
HISTOGRAM = "histogram"
UNTYPED = "untyped"  # used only for peers' counter names that lack `_total` (compat modes)

_ESCAPES = str.maketrans({"\\": "\\\\", '"': '\\"', "\n": "\\n"})
_HELP_ESCAPES = str.maketrans({"\\": "\\\\", "\n": "\\n"})


def escape_label_value(value: str) -> str:
    return value.translate(_ESCAPES)


def label_string(labels: Sequence[tuple[str, str]]) -> str:
    """`{a="1",b="2"}`, or "" for no labels. Label names are trusted (they are ours)."""
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{escape_label_value(v)}"' for k, v in labels) + "}"


def format_value(value: float) -> str:
    """Shortest exact text: ints as they are, integral floats without ".0", NaN and infinities
    as both formats spell them. The common types are tested first: this runs per sample."""
    kind = type(value)
    if kind is int:
        return str(value)
    if kind is float:
        if value.is_integer() and -1e15 < value < 1e15:
            return str(int(value))
        if value != value:
            return "NaN"
        if value in (math.inf, -math.inf):
            return "+Inf" if value > 0 else "-Inf"
        return repr(value)
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(int(value))
    return format_value(float(value))


@dataclass(slots=True)
class Family:
    """One metric family. `name` is the base name: counters without `_total`, info without
    `_info`; the encoders add the suffix each format wants."""

    name: str
    kind: str
    help: str
    samples: list[tuple[str, str]] = field(default_factory=list)  # (label string, value text)
    # Sample lines already encoded, "<sample name>{labels} <value>\n": both formats write a
    # sample line alike, so a renderer building many samples of one family in a tight loop
    # (the compat modes) formats each once instead of as a pair joined later, twice.
    lines: list[str] = field(default_factory=list)

    def add(self, labels: Sequence[tuple[str, str]], value: float) -> None:
        self.samples.append((label_string(labels), format_value(value)))

    def add_rendered(self, labels: str, value: float) -> None:
        """Add a sample whose label string was rendered (and cached) by the caller."""
        self.samples.append((labels, format_value(value)))

    def add_histogram(
        self,
        labels: Sequence[tuple[str, str]],
        buckets: Sequence[tuple[float, int]],
        total: float,
        count: int,
    ) -> None:
        """Add one histogram series: cumulative `(upper bound, count)` buckets, the sum and count.
        The suffix rides in front of the label string, so encoding stays a plain join."""
        for bound, cumulative in buckets:
            le = repr(float(bound))  # OpenMetrics wants canonical floats: "1.0", not "1"
            self.samples.append(("_bucket" + label_string([*labels, ("le", le)]), str(cumulative)))
        self.samples.append(("_bucket" + label_string([*labels, ("le", "+Inf")]), str(count)))
        self.samples.append(("_sum" + label_string(labels), format_value(total)))
        self.samples.append(("_count" + label_string(labels), str(count)))

    @property
    def sample_name(self) -> str:
        if self.kind == COUNTER:
            return self.name + "_total"
        if self.kind == INFO:
            return self.name + "_info"
        return self.name


def encode_text(families: Iterable[Family]) -> bytes:
    """Prometheus text format 0.0.4. Counters and info families keep their suffixed name in
    HELP/TYPE (as prometheus_client does); info is typed gauge there."""
    out: list[str] = []
    for fam in families:
        if not fam.samples and not fam.lines:
            continue
        name = fam.sample_name
        kind = GAUGE if fam.kind == INFO else fam.kind
        out.append(f"# HELP {name} {fam.help.translate(_HELP_ESCAPES)}\n# TYPE {name} {kind}\n")
        out.extend(f"{name}{labels} {value}\n" for labels, value in fam.samples)
        out.extend(fam.lines)
    return "".join(out).encode()


def encode_openmetrics(families: Iterable[Family]) -> bytes:
    """OpenMetrics 1.0: family names without suffix in metadata, `# EOF` terminator."""
    out: list[str] = []
    for fam in families:
        if not fam.samples and not fam.lines:
            continue
        kind = "unknown" if fam.kind == UNTYPED else fam.kind
        help_text = fam.help.translate(_ESCAPES)
        out.append(f"# TYPE {fam.name} {kind}\n# HELP {fam.name} {help_text}\n")
        name = fam.sample_name
        out.extend(f"{name}{labels} {value}\n" for labels, value in fam.samples)
        out.extend(fam.lines)
    out.append("# EOF\n")
    return "".join(out).encode()


def wants_openmetrics(accept: str | None) -> bool:
    """Content negotiation as Prometheus does it: OpenMetrics only when the client asks."""
    if not accept:
        return False
    for part in accept.split(","):
        media = part.split(";", 1)[0].strip().lower()
        if media == "application/openmetrics-text":
            return True
    return False


@dataclass(frozen=True)
class Exposition:
    """One poll's rendered bytes in both formats: what a server hands to every scrape until the
    next poll swaps in a new one. Gzip is computed at most once per format, on the first scrape
    that asks for it."""

    text: bytes
    openmetrics: bytes
    _gzipped: dict[bool, bytes] = field(default_factory=dict, compare=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    @classmethod
    def build(cls, families: Iterable[Family]) -> Exposition:
        fams = list(families)
        return cls(text=encode_text(fams), openmetrics=encode_openmetrics(fams))

    def body(self, openmetrics: bool, use_gzip: bool) -> bytes:
        raw = self.openmetrics if openmetrics else self.text
        if not use_gzip:
            return raw
        with self._lock:
            packed = self._gzipped.get(openmetrics)
            if packed is None:
                packed = self._gzipped[openmetrics] = gzip.compress(raw, compresslevel=1)
            return packed


EMPTY = Exposition(text=b"", openmetrics=b"# EOF\n")
