"""Helpers shared by the conformance modules (not collected: no ``test_`` prefix)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from pytest_devplug.backends.base import UnsupportedOperationError
from pytest_devplug.faults import FaultNotSupportedError
from pytest_devplug.handles import NodeHandle, PluginHandle

__all__ = ["fault", "numa_map", "require_topology", "short_grace_period"]


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


@contextmanager
def fault(what: str) -> Iterator[None]:
    """Run one injector call; a fault the injector says it cannot make skips the test, saying which."""
    try:
        yield
    except FaultNotSupportedError as exc:
        pytest.skip(f"the fault injector cannot {what}: {exc}")
