"""Compat families written from a table of values, a family per formatting pass.

A compat mode repeats ~1,000 readings under a peer's names: per sample, Python work (a call,
an f-string, an append) would cost about as much as everything else the agent renders. Here a
mode hands over its table instead (families x series, one label string per series) and each
family whose series all have a value is written by one %-formatting of a template of its
lines, cached: a node's GPUs and EFA ports do not change between polls. A family some series
lacks a value for is written line by line without it: absent, never 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from exporter.core.exposition import Family, format_value

Spec = tuple[str, str, str]  # family name, kind, help
Value = float | int | None


def families(
    specs: Sequence[Spec], series: tuple[str, ...], columns: Sequence[Sequence[Value]]
) -> list[Family]:
    """One family per spec; `columns[i][j]` is family i's value for the series whose label
    string is `series[j]` (None: that series has none)."""
    out = []
    for (name, kind, help_text), column in zip(specs, columns, strict=True):
        fam = Family(name, kind, help_text)
        if None not in column:
            if not set(map(type, column)) <= {int}:  # ints format as they are, the rest as always
                column = tuple(map(format_value, column))  # type: ignore[arg-type]
            fam.lines.append(_template(name, series) % tuple(column))
        else:
            fam.lines.extend(
                f"{name}{labels} {format_value(v)}\n"
                for labels, v in zip(series, column, strict=True)
                if v is not None
            )
        out.append(fam)
    return out


@lru_cache(maxsize=128)  # per family and shape of the node's table (its GPUs, its EFA ports)
def _template(name: str, series: tuple[str, ...]) -> str:
    return "".join(f"{name}{s}".replace("%", "%%") + " %s\n" for s in series)
