"""The kubelet's Topology Manager (container scope) over NUMA affinity hints, and the device manager's hints.

Mirrors upstream ``pkg/kubelet/cm/topologymanager``: hint providers answer, per resource, every
NUMA-node mask that could satisfy a container; the policy merges one hint per resource (every
permutation, bitwise AND), picks the best with upstream's ``HintMerger`` rules and decides
admission (``none`` and ``best-effort`` always admit; ``restricted`` and ``single-numa-node``
only a preferred hint). Masks are Python ints with bit ``n`` standing for NUMA node ``n``.

The device manager's side (``topology_hints.go``: its hints per resource, and the split of free devices by a
container's affinity) is here too, as pure functions over device -> NUMA nodes maps; the manager takes its lock,
gathers the sets and calls them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence, Set
from dataclasses import dataclass

from .pod_devices import NO_NUMA

__all__ = [
    "POLICIES",
    "TopologyHint",
    "iterate_masks",
    "mask_of",
    "nodes_of",
    "merge_hints",
    "TOPOLOGY_AFFINITY_REASON",
    "TOPOLOGY_AFFINITY_MESSAGE",
    "generate_device_hints",
    "device_hints",
    "filter_by_affinity",
]

POLICIES = ("none", "best-effort", "restricted", "single-numa-node")
#: ``TopologyAffinityError.Type()`` and ``.Error()``.
TOPOLOGY_AFFINITY_REASON = "TopologyAffinityError"
TOPOLOGY_AFFINITY_MESSAGE = "Resources cannot be allocated with Topology locality"


@dataclass(frozen=True)
class TopologyHint:
    """``NUMANodeAffinity`` (``None`` = no preference / any node) and ``Preferred``."""

    affinity: int | None
    preferred: bool

    def nodes(self) -> list[int]:
        return nodes_of(self.affinity) if self.affinity is not None else []


def mask_of(nodes: Sequence[int]) -> int:
    m = 0
    for n in nodes:
        m |= 1 << n
    return m


def nodes_of(mask: int) -> list[int]:
    return [i for i in range(mask.bit_length()) if mask >> i & 1]


def _count(mask: int) -> int:
    return bin(mask).count("1")


def iterate_masks(numa_nodes: Sequence[int]) -> Iterator[int]:
    """``bitmask.IterateBitMasks``: every non-empty subset, by size, then in combination order."""
    for k in range(1, len(numa_nodes) + 1):
        for combo in itertools.combinations(numa_nodes, k):
            yield mask_of(combo)


def _narrower(a: int, b: int) -> bool:
    """``BitMask.IsNarrowerThan``: fewer bits, or as many bits and numerically smaller."""
    ca, cb = _count(a), _count(b)
    return a < b if ca == cb else ca < cb


def _filter_providers_hints(
    providers_hints: Sequence[Mapping[str, list[TopologyHint] | None]],
) -> list[list[TopologyHint]]:
    """``filterProvidersHints``: no hints at all or ``None`` for a resource = any node, preferred;
    an empty list for a resource = impossible, so any node, not preferred."""
    out: list[list[TopologyHint]] = []
    for hints in providers_hints:
        if not hints:
            out.append([TopologyHint(None, True)])
            continue
        for resource in sorted(hints):
            h = hints[resource]
            if h is None:
                out.append([TopologyHint(None, True)])
            elif len(h) == 0:
                out.append([TopologyHint(None, False)])
            else:
                out.append(list(h))
    return out


def _filter_single_numa(all_hints: list[list[TopologyHint]]) -> list[list[TopologyHint]]:
    """``filterSingleNumaHints``: keep preferred don't-cares and preferred single-node masks."""
    out = []
    for hints in all_hints:
        out.append([h for h in hints if h.preferred and (h.affinity is None or _count(h.affinity) == 1)])
    return out


def _merge_permutation(default: int, permutation: Sequence[TopologyHint]) -> TopologyHint:
    preferred = True
    affinities: list[int] = []
    for h in permutation:
        if h.affinity is not None:
            affinities.append(h.affinity)
            if h.affinity != affinities[0]:
                preferred = False
        if not h.preferred:
            preferred = False
    merged = default
    for a in affinities:
        merged &= a
    return TopologyHint(merged, preferred)


def _permutations(all_hints: list[list[TopologyHint]]) -> Iterator[tuple[TopologyHint, ...]]:
    yield from itertools.product(*all_hints)


def _merge(numa_nodes: Sequence[int], all_hints: list[list[TopologyHint]]) -> TopologyHint:
    """``HintMerger.Merge`` with the default (narrowest) mask comparison."""
    default = mask_of(numa_nodes)
    best_non_preferred = 0
    for hints in all_hints:
        narrowest: int | None = None
        for h in hints:
            if h.affinity is None:
                continue
            if narrowest is None or _narrower(h.affinity, narrowest):
                narrowest = h.affinity
        if narrowest is not None and _count(narrowest) > best_non_preferred:
            best_non_preferred = _count(narrowest)

    def compare_masks(cur: TopologyHint, cand: TopologyHint) -> TopologyHint:
        assert cur.affinity is not None and cand.affinity is not None
        if cand.affinity == cur.affinity:
            return cur
        return cand if _narrower(cand.affinity, cur.affinity) else cur

    def compare(cur: TopologyHint | None, cand: TopologyHint) -> TopologyHint | None:
        assert cand.affinity is not None
        if _count(cand.affinity) == 0:
            return cur
        if cur is None:
            return cand
        assert cur.affinity is not None
        if not cur.preferred and cand.preferred:
            return cand
        if cur.preferred and not cand.preferred:
            return cur
        if cur.preferred and cand.preferred:
            return compare_masks(cur, cand)
        c_cur, c_cand = _count(cur.affinity), _count(cand.affinity)
        if c_cur > best_non_preferred:
            return compare_masks(cur, cand)
        if c_cur == best_non_preferred:
            return compare_masks(cur, cand) if c_cand == best_non_preferred else cur
        if c_cand > best_non_preferred:
            return cur
        if c_cand == best_non_preferred:
            return cand
        if c_cand > c_cur:
            return cand
        if c_cand < c_cur:
            return cur
        return compare_masks(cur, cand)

    best: TopologyHint | None = None
    for perm in _permutations(all_hints):
        best = compare(best, _merge_permutation(default, perm))
    return best if best is not None else TopologyHint(default, False)


def merge_hints(
    policy: str, numa_nodes: Sequence[int], providers_hints: Sequence[Mapping[str, list[TopologyHint] | None]]
) -> tuple[TopologyHint, bool]:
    """``Policy.Merge``: the best hint for a container and whether the policy admits it."""
    if policy == "none":
        return TopologyHint(None, True), True
    filtered = _filter_providers_hints(providers_hints)
    if policy == "best-effort":
        return _merge(numa_nodes, filtered), True
    if policy == "restricted":
        best = _merge(numa_nodes, filtered)
        return best, best.preferred
    if policy == "single-numa-node":
        best = _merge(numa_nodes, _filter_single_numa(filtered))
        if best.affinity == mask_of(numa_nodes):
            best = TopologyHint(None, best.preferred)
        return best, best.preferred
    raise ValueError(f"unknown topology manager policy {policy!r}; known: {', '.join(POLICIES)}")


def generate_device_hints(
    numa_nodes: Sequence[int],
    device_nodes: Mapping[str, Sequence[int]],
    available: set[str],
    reusable: set[str],
    request: int,
) -> list[TopologyHint]:
    """``generateDeviceTopologyHints``: every mask that holds ``request`` devices (reusable ones
    must all lie inside it); preferred = as narrow as the narrowest mask that *all* devices of
    the resource (free or not) could satisfy."""
    min_size = len(numa_nodes)
    hints: list[TopologyHint] = []
    for mask in iterate_masks(numa_nodes):
        in_mask = sum(1 for nodes in device_nodes.values() if mask & mask_of(nodes))
        if in_mask >= request and _count(mask) < min_size:
            min_size = _count(mask)
        matching = 0
        ok = True
        for d in reusable:
            nodes = device_nodes.get(d)
            if not nodes:
                continue
            if not mask & mask_of(nodes):
                ok = False
                break
            matching += 1
        if not ok:
            continue
        matching += sum(1 for d in available if mask & mask_of(device_nodes.get(d, ())))
        if matching < request:
            continue
        hints.append(TopologyHint(mask, False))
    return [TopologyHint(h.affinity, h.affinity is not None and _count(h.affinity) == min_size) for h in hints]


def device_hints(
    numa_nodes: Sequence[int],
    device_nodes: Mapping[str, Sequence[int]],
    *,
    allocated: Set[str],
    available: Set[str],
    reusable: Set[str],
    request: int,
) -> list[TopologyHint] | None:
    """One resource's ``GetTopologyHints`` answer for a container: ``None`` when no device of the resource reports a
    NUMA node (no preference), ``[]`` when the request cannot be met. Devices ``allocated`` to the container before
    (a kubelet restart) are hinted alone; else the free ones plus those ``reusable`` from its init containers."""
    if not any(device_nodes.values()):
        return None
    if allocated:
        if len(allocated) != request:
            return []
        return generate_device_hints(numa_nodes, device_nodes, set(allocated), set(), request)
    if len(available | reusable) < request:
        return []
    return generate_device_hints(numa_nodes, device_nodes, set(available), set(reusable), request)


def filter_by_affinity(
    hint: TopologyHint | None, device_nodes: Mapping[str, Sequence[int]], available: Set[str]
) -> tuple[set[str], set[str], set[str]]:
    """``filterByAffinity``: split free devices into those inside the container's NUMA affinity, those outside it
    and those without topology. A device on several nodes counts where its best node is: inside the hint first,
    then the node with the fewest free devices."""
    if hint is None or hint.affinity is None or not any(device_nodes.values()):
        return set(), set(), set(available)
    in_hint = set(hint.nodes())
    per_node: dict[int, set[str]] = {}
    for d in available:
        for n in device_nodes.get(d) or [NO_NUMA]:
            per_node.setdefault(n, set()).add(d)

    def order(n: int) -> tuple[int, int, int]:
        group = 0 if n in in_hint else (2 if n == NO_NUMA else 1)
        return (group, len(per_node[n]), n)

    nodes = sorted(per_node, key=order)
    aligned: set[str] = set()
    unaligned: set[str] = set()
    without: set[str] = set()
    for d in available:
        for n in nodes:
            if d in per_node[n]:
                if n == NO_NUMA:
                    without.add(d)
                elif n in in_hint:
                    aligned.add(d)
                else:
                    unaligned.add(d)
                break
    return aligned, unaligned, without
