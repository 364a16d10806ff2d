"""Helpers shared by the conformance modules (not collected: no ``test_`` prefix)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from pytest_devplug.errors import UnsupportedOperationError
from pytest_devplug.handles import NodeHandle, PluginHandle
from pytest_devplug.suite_support import fault
from pytest_devplug.waiting import wait_for

__all__ = ["device_count", "fault", "numa_map", "require_topology", "short_grace_period", "wait_marked_unhealthy"]


def numa_map(node: NodeHandle, resource: str) -> dict[str, int]:
    """Device ID -> its single NUMA node, for devices that report exactly one."""
    return {d: n[0] for d, n in node.device_numa(resource).items() if len(n) == 1}


def require_topology(plugin: PluginHandle, *, min_nodes: int = 2) -> dict[str, int]:
    """The devices' NUMA nodes, or a skip saying the plugin reports no (multi-node) topology."""
    numa = numa_map(plugin.node, plugin.resource_name)
    if len(set(numa.values())) < min_nodes:
        pytest.skip(f"the devices of {plugin.resource_name} report no topology over {min_nodes}+ NUMA nodes: {numa}")
    return numa


@contextmanager
def short_grace_period(plugin: PluginHandle, seconds: float) -> Iterator[float]:
    """Shorten the kubelet's grace period where the backend can (sim); else yield the real one."""
    backend = plugin.backend
    old = backend.grace_period
    try:
        backend.set_grace_period(seconds)
    except UnsupportedOperationError:
        yield old
        return
    try:
        yield seconds
    finally:
        backend.set_grace_period(old)


def wait_marked_unhealthy(
    plugin: PluginHandle, domain: list[str], *, capacity: int, faulted: tuple[str, ...] = ()
) -> list[str]:
    """Wait until the plugin marked some device of ``domain`` Unhealthy and the node's counts agree with what
    it lists: capacity ``capacity``, allocatable down by every device of ``domain`` and ``faulted`` (earlier
    faults' domains) gone from the allocatable devices. Returns the devices of ``domain`` marked.

    Whether a fault reaches *every* device of its domain is the ``nvml-xid`` checks' verdict (reported
    once, there); these checks judge the kubelet's side of whatever the plugin marked.
    """
    res, node = plugin.resource_name, plugin.node

    def ok(seen: tuple[tuple[int | None, int | None], list[str]]) -> bool:
        (cap, alloc), ids = seen
        gone = {*domain, *faulted} - set(ids)
        return cap == capacity and bool(set(domain) - set(ids)) and alloc == capacity - len(gone)

    _, ids = wait_for(
        lambda: (node.counts(res), node.device_ids(res)),
        ok,
        timeout=node.timeout,
        what=f"some of {domain} Unhealthy, (capacity, allocatable) agreeing with the allocatable devices",
        give_up=plugin.crashed,
    )
    return sorted(set(domain) - set(ids))


def device_count(plugin: PluginHandle, wanted: int, *, needed: int = 1) -> int:
    """How many devices a check asks for: ``wanted``, or as many as the node has when fewer; a skip, at once
    and saying what the check needs, when it has fewer than ``needed`` (no wait for an "Insufficient")."""
    n = plugin.node.allocatable(plugin.resource_name)
    if n < needed:
        pytest.skip(f"needs {needed} allocatable {plugin.resource_name} devices; the node has {n}")
    return min(wanted, n)
