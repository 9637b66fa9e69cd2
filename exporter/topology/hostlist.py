"""Slurm hostlist expressions: `ip-10-1-2-[3-5,9]` <-> the names they stand for.

Slurm writes and reads node lists in this compressed form (topology.conf `Nodes=`, scontrol
output), so both directions are needed: compression to write a readable topology.conf, expansion
to compare an existing one with EC2. Only the last run of digits of a name is ranged, which is
what Slurm itself does for one-dimensional names; zero padding is kept as written.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from itertools import product

__all__ = ["HostlistError", "compress", "expand"]

_TRAILING_NUMBER = re.compile(r"^(.*?)(\d+)$")


class HostlistError(ValueError):
    """A hostlist expression Slurm would not accept (unbalanced brackets, bad ranges)."""


def compress(names: Iterable[str]) -> str:
    """One hostlist expression for `names` (duplicates dropped, output sorted and stable).

    Names sharing everything but a trailing number are folded into `prefix[a-b,c]`; a number
    with leading zeros only joins names of the same width, so expansion gives the names back.
    """
    plain: set[str] = set()
    by_prefix: dict[str, list[str]] = {}
    for name in set(names):
        match = _TRAILING_NUMBER.match(name)
        if match is None:
            plain.add(name)
        else:
            by_prefix.setdefault(match.group(1), []).append(match.group(2))
    numbered: dict[tuple[str, int], set[int]] = {}  # (prefix, width or 0 for unpadded) -> numbers
    for prefix, all_digits in by_prefix.items():
        padded = {len(d) for d in all_digits if d.startswith("0") and len(d) > 1}
        for digits in all_digits:
            width = len(digits) if len(digits) in padded else 0
            numbered.setdefault((prefix, width), set()).add(int(digits))
    parts: list[tuple[str, str]] = [(name, name) for name in plain]
    for (prefix, width), numbers in numbered.items():
        ranges = _ranges(sorted(numbers), width)
        if len(numbers) == 1:
            parts.append((prefix + ranges[0], prefix))
        else:
            parts.append((f"{prefix}[{','.join(ranges)}]", prefix))
    return ",".join(text for text, _ in sorted(parts, key=lambda part: (part[1], part[0])))


def _ranges(numbers: list[int], width: int) -> list[str]:
    out: list[str] = []
    start = previous = numbers[0]
    for number in [*numbers[1:], None]:
        if number is not None and number == previous + 1:
            previous = number
            continue
        first, last = f"{start:0{width}d}", f"{previous:0{width}d}"
        out.append(first if start == previous else f"{first}-{last}")
        if number is not None:
            start = previous = number
    return out


def expand(expression: str) -> list[str]:
    """The names of a hostlist expression, in the order written. Raises HostlistError."""
    names: list[str] = []
    for item in _split_top_level(expression.strip()):
        if item:
            names.extend(_expand_item(item, expression))
    return names


def _split_top_level(text: str) -> list[str]:
    items: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"nested brackets in hostlist {text!r}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unbalanced ']' in hostlist {text!r}")
        if char == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth:
        raise HostlistError(f"unclosed '[' in hostlist {text!r}")
    items.append("".join(current))
    return items


def _expand_item(item: str, expression: str) -> list[str]:
    """`rack[1-2]-n[01-02]` -> every combination, left bracket varying slowest (as Slurm)."""
    pieces = re.split(r"(\[[^\]]*\])", item)
    choices: list[list[str]] = []
    for piece in pieces:
        if piece.startswith("["):
            choices.append(_expand_ranges(piece[1:-1], expression))
        elif piece:
            choices.append([piece])
    return ["".join(combination) for combination in product(*choices)]


def _expand_ranges(body: str, expression: str) -> list[str]:
    values: list[str] = []
    for part in body.split(","):
        first, sep, last = part.strip().partition("-")
        if not first.isdigit() or (sep and not last.isdigit()):
            raise HostlistError(f"bad range {part!r} in hostlist {expression!r}")
        if not sep:
            values.append(first)
            continue
        low, high = int(first), int(last)
        if high < low:
            raise HostlistError(f"descending range {part!r} in hostlist {expression!r}")
        if high - low > 100_000:
            raise HostlistError(f"range {part!r} too large in hostlist {expression!r}")
        width = len(first) if first.startswith("0") else 0
        values.extend(f"{number:0{width}d}" for number in range(low, high + 1))
    return values
