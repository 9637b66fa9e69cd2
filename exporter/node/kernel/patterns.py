"""Recognise the GPU, NVSwitch, EFA, PCIe and hung-task faults that only the kernel log shows.

The node agent's kernel log reader hands every record's message text to `match_line`: the part
after ``;`` in a /dev/kmsg record, or the journal's MESSAGE, with no syslog or dmesg prefix, so
every row matches from the start of the message, where the driver's own prefix is ("NVRM: ",
"nvidia-nvswitch3: ", "efa 0000:00:06.0: ", "pcieport 0000:00:01.0: "...). Up to a thousand
lines a second come, almost none of them faults, so a line first passes a two-check gate (does
it start like one of our drivers' lines, or carry "AER: ", "Bus Error" or " callbacks suppressed"
anywhere?), then each
kind's rows are tried only when one of the kind's literals is in the line (`_KIND_LITERALS`).

What a fault looks like lives in one data file, ``exporter/core/data/kernel-log-patterns.csv``
(``name,kind,severity,regex,source``), each row citing the driver or kernel format string it
follows. Rows are tried in file order and the first match wins, which is how an XID line that
also says "NVLink ... link 6" stays an XID (the integrator dedups it against NVML's XID events).

A row's regex may name the groups ``code`` (the XID or SXid number), ``pci`` (an address, NVRM
or sysfs form), ``device`` (what else the line names) and ``severity`` (the severity word the
line itself carries, as AER and SXid lines do; the row's column is the severity otherwise).
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

KINDS: tuple[str, ...] = (
    "xid",
    "sxid",
    "gpu_fallen_off_bus",
    "efa_driver",
    "pcie_aer",
    "nvlink",
    "hung_task",
    "uvm_fatal",  # NVIDIA UVM's global fatal error: the driver asks for an OS reboot
    "gpu_init_failed",  # RmInitAdapter failed: a GPU the driver could not initialise
    "printk_suppressed",  # the kernel's ratelimit dropped N messages: counted, not judged
)

SEVERITIES: tuple[str, ...] = ("fatal", "error", "warning", "corrected")

# The named groups a row's regex may use; anything else is a typo in the table. `code` is the XID
# or SXid number, or the number of messages a "callbacks suppressed" line says were dropped.
GROUPS: frozenset[str] = frozenset({"code", "pci", "device", "severity"})

# Stage one: rows match from the start of the message, so a line can match only if it starts
# with one of these driver prefixes or, being an AER line (which starts with whichever driver
# owns the device), carries one of `_ANYWHERE`. One startswith and two substring checks settle
# almost every line. A new kind whose lines pass neither must extend these.
_LINE_STARTS: tuple[str, ...] = ("NVRM: ", "nvidia-nvswitch", "efa ", "infiniband ", "INFO: task ")
# AER lines start with whichever driver owns the device; the ratelimit's "callbacks suppressed"
# with the name of whichever function was rate-limited.
_ANYWHERE: tuple[str, ...] = ("AER: ", "Bus Error", " callbacks suppressed")

# Stage two: every line of a kind carries one of these literals, so a line without any of them
# skips the kind's rows: `in` on a str is a fast substring search, far cheaper than a regex.
_KIND_LITERALS: dict[str, tuple[str, ...]] = {
    "xid": ("Xid (",),
    "sxid": ("SXid (",),
    "gpu_fallen_off_bus": ("fallen off the bus",),
    "efa_driver": ("efa ", "infiniband "),
    "pcie_aer": ("AER: ", "Bus Error"),
    "nvlink": ("NVLink: ",),
    "hung_task": ("blocked for more than",),
    "uvm_fatal": ("uvm encountered global fatal error",),
    "gpu_init_failed": ("RmInitAdapter failed",),
    "printk_suppressed": (" callbacks suppressed",),
}

# The severity words lines carry (AER's aer_error_severity_string, old and new spellings, and
# the SXid/NVLink "Fatal" / "Non-fatal" / "Correctable"), lower-cased, to our four severities.
_SEVERITY_WORDS: dict[str, str] = {
    "fatal": "fatal",
    "non-fatal": "warning",
    "correctable": "corrected",
    "corrected": "corrected",
    "uncorrected (non-fatal)": "error",
    "uncorrectable (non-fatal)": "error",
    "uncorrected (fatal)": "fatal",
    "uncorrectable (fatal)": "fatal",
}

# Kernel records are at most a couple of kB (PRINTK_MESSAGE_MAX); anything longer is not a
# kernel message we know, and cutting it bounds what one pathological line can cost.
_MAX_CHARS = 8192

_PCI = re.compile(
    r"(?:PCI:)?(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):"
    r"(?P<dev>[0-9a-fA-F]{1,2})(?:\.(?P<fn>[0-7]))?"
)


@dataclass(frozen=True, slots=True)
class Pattern:
    """One row of the pattern table, its regex compiled."""

    name: str
    kind: str  # one of KINDS
    severity: str  # one of SEVERITIES; a line's own severity word overrides it
    regex: re.Pattern[str]
    source: str  # where the format comes from


@dataclass(frozen=True, slots=True)
class LogMatch:
    """What one kernel log line says went wrong, and where."""

    kind: str  # one of KINDS
    pattern: str  # the matching row's name
    severity: str  # "fatal" | "error" | "warning" | "corrected"
    code: int | None = None  # XID or SXid number
    pci_address: str | None = None  # sysfs form: "0000:53:00.0"
    device: str | None = None  # EFA ib device, "nvidia-nvswitch3", task "python3:1234", "link 6"


# Stage zero, on the raw /dev/kmsg record (`prio,seq,usec,flags;message`), before it is even
# parsed: the message starts right after the first ";". A find and a startswith beat one
# compiled alternation here (about 0.7 against 1.0 us a record, measured).
_RAW_STARTS: tuple[bytes, ...] = tuple(start.encode() for start in _LINE_STARTS)
_RAW_ANYWHERE: tuple[bytes, ...] = tuple(word.encode() for word in _ANYWHERE)


def record_may_match(raw: bytes) -> bool:
    """Whether any row could match the message of this raw kmsg record. A record refused here
    is one `match_line` would refuse too (its stage one looks for the same words); the reader
    then skips parsing it (exporter/sources/kmsg.py `keep`)."""
    return (
        raw.startswith(_RAW_STARTS, raw.find(b";") + 1)
        or _RAW_ANYWHERE[0] in raw
        or _RAW_ANYWHERE[1] in raw
        or _RAW_ANYWHERE[2] in raw
    )


def nvrm_pci_to_sysfs(text: str) -> str | None:
    """The sysfs form of a PCI address as drivers print it, or None if `text` is not one.

    NVRM prints ``PCI:0000:53:00`` (no function), NVSwitch and the kernel ``0000:53:00.0``;
    sysfs, NVML and the rest of the agent key GPUs by ``0000:53:00.0`` (4-digit domain,
    lower-case, with the function), so every address is brought to that one form.
    """
    m = _PCI.fullmatch(text.strip())
    if m is None:
        return None
    domain = int(m["domain"] or "0", 16)
    bus, dev, fn = int(m["bus"], 16), int(m["dev"], 16), int(m["fn"] or "0")
    if dev > 0x1F:  # a PCI device number has five bits
        return None
    return f"{domain:04x}:{bus:02x}:{dev:02x}.{fn}"


def _row(raw: dict[str, str], seen: set[str]) -> Pattern:
    """Check one CSV row and compile it; a bad table must fail loudly at load, not match
    nothing in production."""
    name, kind, severity, source = raw["name"], raw["kind"], raw["severity"], raw["source"]
    if name in seen:
        raise ValueError(f"kernel log pattern {name!r} appears twice")
    if kind not in KINDS:
        raise ValueError(f"kernel log pattern {name!r}: kind {kind!r} not in {KINDS}")
    if severity not in SEVERITIES:
        raise ValueError(f"kernel log pattern {name!r}: severity {severity!r} not in {SEVERITIES}")
    if not source.strip():
        raise ValueError(f"kernel log pattern {name!r} cites no source")
    regex = re.compile(raw["regex"])
    unknown = set(regex.groupindex) - GROUPS
    if unknown:
        raise ValueError(f"kernel log pattern {name!r}: unknown groups {sorted(unknown)}")
    seen.add(name)
    return Pattern(name, kind, severity, regex, source)


@cache
def patterns() -> tuple[Pattern, ...]:
    """The pattern table, in file order (first match wins)."""
    text = resources.files("exporter.core.data").joinpath("kernel-log-patterns.csv").read_text()
    seen: set[str] = set()
    return tuple(_row(raw, seen) for raw in csv.DictReader(text.splitlines()))


@cache
def _plan() -> tuple[tuple[tuple[str, ...], tuple[Pattern, ...]], ...]:
    """The rows grouped by kind behind their kind's literals, kinds in the order of their
    first row, so a line is tried against the same rows in the same order as the file."""
    order: list[str] = []
    by_kind: dict[str, list[Pattern]] = {}
    for p in patterns():
        if p.kind not in by_kind:
            order.append(p.kind)
            by_kind[p.kind] = []
        by_kind[p.kind].append(p)
    return tuple((_KIND_LITERALS[k], tuple(by_kind[k])) for k in order)


def _sysfs(pci: str) -> str | None:
    """`nvrm_pci_to_sysfs` with a fast path for the two shapes the drivers print (this runs for
    every fault line, and the general parser costs a regex and four int conversions)."""
    if pci[4:5] == ":" and pci[7:8] == ":":
        if len(pci) == 12 and pci[10] == ".":
            return pci.lower()
        if len(pci) == 10:
            return pci.lower() + ".0"
    return nvrm_pci_to_sysfs(pci)


def _result(p: Pattern, m: re.Match[str]) -> LogMatch:
    groups = m.groupdict()
    word = groups.get("severity")
    severity = _SEVERITY_WORDS.get(word.lower(), p.severity) if word else p.severity
    code = groups.get("code")
    pci = groups.get("pci")
    return LogMatch(
        kind=p.kind,
        pattern=p.name,
        severity=severity,
        code=int(code) if code else None,
        pci_address=_sysfs(pci) if pci else None,
        device=groups.get("device") or None,
    )


def match_line(message: str) -> LogMatch | None:
    """The fault one kernel log message names, or None (as for almost every line).

    `message` is the message text alone (no syslog, journal or dmesg prefix).
    """
    text = message[:_MAX_CHARS]
    if (
        not text.startswith(_LINE_STARTS)
        and _ANYWHERE[0] not in text
        and _ANYWHERE[1] not in text
        and _ANYWHERE[2] not in text
    ):
        return None
    for literals, rows in _plan():
        for literal in literals:
            if literal in text:
                break
        else:
            continue
        for p in rows:
            m = p.regex.match(text)
            if m is not None:
                return _result(p, m)
    return None
