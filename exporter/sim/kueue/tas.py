"""Topology-Aware Scheduling for one pod set on one flavor, as Kueue's TAS decides it.

Ported from pkg/cache/scheduler/tas_flavor_snapshot.go (kubernetes-sigs/kueue @ff69552) with
the default feature gates (BestFit, no slices, no leaders, no balanced placement):

- the leaves are the flavor's schedulable and Ready nodes (tas_nodes_cache.go: a cordoned or
  NotReady node is not a candidate at all); a node whose taints the pod's tolerations plus the
  flavor's do not tolerate, or whose labels fail the pod's nodeSelector, is excluded and
  counted (scheduling_simulator_default.go `FindFeasibleNodes`);
- each leaf holds as many pods as every requested resource allows, plus one `pods` per pod,
  against allocatable minus what is already placed there; a leaf that holds none counts its
  limiting resource (`fillLeafCounts`, resources.CountInWithLimitingResource);
- `findLevelWithFitDomains`: domains at the requested level sorted by capacity (largest first,
  then the smaller pod count, then the level values); the best fit (the smallest that holds
  every pod) when the largest does; else a required request fails with the largest's count, a
  preferred one climbs one level, and at the top (or unconstrained) spreads greedily;
- then down level by level over the chosen domains' children, largest first and the tightest
  fit for the remainder (`updateCountsToMinimumGeneric`);
- the not-fit message is `notFitMessage`'s, with the exclusion statistics.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from exporter.sim.kueue.resources import (
    PODS,
    Res,
    Taint,
    Toleration,
    fits_count,
    matches,
    untolerated,
)


@dataclass(frozen=True, slots=True)
class Leaf:
    name: str
    values: tuple[str, ...]  # the node's value for each level, highest first
    taints: tuple[Taint, ...]
    labels: Mapping[str, str]


@dataclass(slots=True)
class Miss:
    """Why the pod set does not fit, in Kueue's words and as numbers."""

    fit: int  # pods that fit (the largest domain for required, everything for the rest)
    count: int
    total_nodes: int
    taints: dict[str, int] = field(default_factory=dict)
    selector: int = 0
    resources: dict[str, int] = field(default_factory=dict)

    def message(self, topology: str) -> str:
        """tas_flavor_snapshot.go notFitMessage with tasExclusionStats.formatReasons."""
        if self.fit <= 0:
            text = f'topology "{topology}" doesn\'t allow to fit any of {self.count} pod(s)'
        else:
            text = f'topology "{topology}" allows to fit only {self.fit} out of {self.count} pod(s)'
        reasons = []
        if self.selector:
            reasons.append(f"nodeSelector: {self.selector}")
        reasons += [f'taint "{t}": {n}' for t, n in sorted(self.taints.items())]
        reasons += [f'resource "{r}": {n}' for r, n in sorted(self.resources.items())]
        if reasons:
            text += f". Total nodes: {self.total_nodes}; excluded: {', '.join(sorted(reasons))}"
        return text


@dataclass(frozen=True, slots=True)
class Placed:
    """Pods per node, and the domains at the requested level they landed in."""

    nodes: tuple[tuple[str, int], ...]
    domains: tuple[str, ...]


@dataclass(eq=False, slots=True)
class _Domain:
    values: tuple[str, ...]
    children: list[_Domain]
    leaf: Leaf | None = None
    count: int = 0  # podCount (sliceCount: slices are single pods here)


def _sort_key(d: _Domain) -> tuple[int, int, tuple[str, ...]]:
    # sortedDomains (BestFit): sliceCount descending, podCount ascending, level values.
    return (-d.count, d.count, d.values)


def _best_fit(domains: Sequence[_Domain], needed: int) -> _Domain:
    """findBestFitDomainBy: the first domain with the smallest count >= needed (else the
    first)."""
    best: _Domain | None = None
    for d in domains:
        if d.count >= needed and (best is None or d.count < best.count):
            best = d
    return best if best is not None else domains[0]


def _minimum(domains: Sequence[_Domain], count: int) -> list[_Domain]:
    """updateCountsToMinimumGeneric (no leaders): largest first, the tightest fit last."""
    out: list[_Domain] = []
    remaining = count
    for i, d in enumerate(domains):
        dom = d
        if dom.count >= remaining:
            dom = _best_fit(domains[i:], remaining)
        if dom.count >= remaining:
            dom.count = remaining
            out.append(dom)
            return out
        remaining -= dom.count
        out.append(dom)
    return out


def place(
    leaves: Sequence[Leaf],
    free: Mapping[str, Res],
    per_pod: Res,
    count: int,
    levels: Sequence[str],
    mode: str,
    level: str | None,
    tolerations: Sequence[Toleration] = (),
    selector: Mapping[str, str] | None = None,
) -> Placed | Miss:
    """Where `count` pods of `per_pod` go on `leaves` (their `free` resources), or why not.

    `mode` is "required", "preferred" or "unconstrained" (an implied request on a TAS-only
    ClusterQueue is unconstrained at the lowest level, levelKeyWithImpliedFallback)."""
    requests = dict(per_pod)
    requests[PODS] = requests.get(PODS, 0) + 1  # resources.OnePodRequest
    miss = Miss(0, count, 0)
    depth = len(levels)
    roots: dict[str, _Domain] = {}
    by_level: list[dict[tuple[str, ...], _Domain]] = [{} for _ in range(depth)]
    for leaf in leaves:
        miss.total_nodes += 1
        taint = untolerated(leaf.taints, tolerations)
        if taint is not None:
            key = taint.to_string()
            miss.taints[key] = miss.taints.get(key, 0) + 1
            continue
        if selector and not matches(selector, leaf.labels):
            miss.selector += 1
            continue
        pods, limiting = fits_count(requests, free.get(leaf.name, {}))
        if pods == 0 and limiting:
            miss.resources[limiting] = miss.resources.get(limiting, 0) + 1
        parent: _Domain | None = None
        for i in range(depth):
            path = leaf.values[: i + 1]
            dom = by_level[i].get(path)
            if dom is None:
                dom = by_level[i][path] = _Domain(path, [])
                if parent is None:
                    roots[path[0]] = dom
                else:
                    parent.children.append(dom)
            parent = dom
        assert parent is not None
        parent.leaf = leaf
        parent.count = pods
    for root in roots.values():
        _fill(root)
    index = depth - 1 if mode == "unconstrained" or level is None else levels.index(level)
    unconstrained = mode == "unconstrained" or level is None
    required = mode == "required"
    found = _fit_level(by_level, index, count, required, unconstrained, miss)
    if isinstance(found, Miss):
        return found
    fit_index, chosen = found
    chosen = _minimum(chosen, count)
    current = fit_index
    while current < depth - 1:
        lower = sorted((c for d in chosen for c in d.children), key=_sort_key)
        chosen = _minimum(lower, count)
        current += 1
    nodes = tuple(
        (d.leaf.name, d.count)
        for d in sorted(chosen, key=lambda d: d.values)
        if d.leaf is not None and d.count > 0
    )
    index_values = {leaf.name: leaf.values for leaf in leaves}
    domains = tuple(sorted({index_values[n][index] for n, _ in nodes}))
    return Placed(nodes, domains)


def _fill(domain: _Domain) -> None:
    if not domain.children:
        return
    for child in domain.children:
        _fill(child)
    domain.count = sum(c.count for c in domain.children)


def _fit_level(
    by_level: list[dict[tuple[str, ...], _Domain]],
    index: int,
    count: int,
    required: bool,
    unconstrained: bool,
    miss: Miss,
) -> tuple[int, list[_Domain]] | Miss:
    """findLevelWithFitDomains (BestFit, no leaders)."""
    domains = sorted(by_level[index].values(), key=_sort_key)
    if not domains:
        miss.fit = 0
        return miss
    top = domains[0]
    if top.count >= count:
        return index, [_best_fit(domains, count)]
    if required:
        miss.fit = top.count
        return miss
    if index > 0 and not unconstrained:
        return _fit_level(by_level, index - 1, count, required, unconstrained, miss)
    results: list[_Domain] = []
    remaining = count
    for i, d in enumerate(domains):
        if remaining <= 0:
            break
        dom = d
        if dom.count >= remaining:
            dom = _best_fit(domains[i:], remaining)
        results.append(dom)
        remaining -= dom.count
    if remaining > 0:
        miss.fit = count - remaining
        return miss
    return index, results


def largest_domains(
    leaves: Sequence[Leaf],
    free: Mapping[str, Res],
    per_pod: Res,
    levels: Sequence[str],
    level: str,
    tolerations: Sequence[Toleration] = (),
) -> tuple[int, tuple[str, ...]]:
    """The most pods one domain of `level` holds now, and which domains hold that many."""
    requests = dict(per_pod)
    requests[PODS] = requests.get(PODS, 0) + 1
    index = levels.index(level)
    held: dict[str, int] = {}
    for leaf in leaves:
        if untolerated(leaf.taints, tolerations) is not None:
            continue
        pods, _ = fits_count(requests, free.get(leaf.name, {}))
        held[leaf.values[index]] = held.get(leaf.values[index], 0) + pods
    if not held:
        return 0, ()
    most = max(held.values())
    return most, tuple(sorted(d for d, n in held.items() if n == most))
