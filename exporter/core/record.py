"""`record`: an immutable value class that costs what a plain one does to build.

The cluster model parses every watch event into such values (a Pod, a Node, a Workload and
the conditions, pod sets and placements inside it). A `@dataclass(frozen=True)` stores each
field through `object.__setattr__`, a call per field: building one Pod costs about three times
a plain dataclass's (4.1 against 1.3 us), and a frozen build was a sixth of the model's whole
cost per event (benchmarks/side_by_side.py, callgrind: 192k -> 165k instructions per event).

So a `record` is frozen where it matters, for the type checker (PEP 681 `frozen_default`: mypy
strict, which CI runs, rejects any assignment to a field), and at run time a slotted dataclass
with value equality and a value hash (`unsafe_hash`, exactly what `frozen=True` generates), so
it is a dict key or a set member as before. What it gives up is the run-time error on an
assignment that mypy would already have refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar, dataclass_transform

T = TypeVar("T")


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def record(cls: type[T]) -> type[T]:
    """An immutable value class (see the module's docstring): `@record` over the class."""
    return dataclass(slots=True, unsafe_hash=True)(cls)
