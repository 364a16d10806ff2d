"""Differential tests: one scenario on the embedded kubelet and on kind, compared by what a user observes.

The kind side is the session's devplug fixtures (run with ``--devplug-backend kind``); the sim side is an
embedded kubelet started here with the same plugin spec. Without ``--devplug-backend kind`` these tests
are skipped, or fail where the kind tier is required (``DEVPLUG_KIND_REQUIRED``/``CI``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from pytest_devplug import ClusterHandle, NodeSpec, PluginHandle, PluginSpec, PodFactory
from pytest_devplug.backends.base import BackendOptions
from pytest_devplug.backends.sim import SimBackend
from pytest_devplug.plugin import NODE_NAME
from pytest_devplug.settings import DevplugSettings

from .diff_helpers import REPLICAS, Side, kind_required


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "kind: needs a real kind cluster (run by `nox -s e2e`)")


@pytest.fixture(scope="session")
def _sim_plugin(devplug_settings: DevplugSettings, devplug_plugin_spec: PluginSpec) -> Iterator[PluginHandle]:
    if devplug_settings.backend != "kind":
        reason = "differential tests compare against kind: run them with --devplug-backend kind"
        if kind_required():
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    if not devplug_plugin_spec.mock:
        pytest.skip("differential tests drive both sides through the mock NVML: the plugin under test must read it")
    opts = devplug_settings.backend_options
    backend = SimBackend(BackendOptions(timeout=opts.timeout, grace_period=300.0))
    backend.start()
    try:
        cluster = ClusterHandle(backend, timeout=opts.timeout)
        node = cluster.ensure_node(NodeSpec(NODE_NAME, numa_nodes=max(devplug_plugin_spec.numa_nodes, 1)))
        plugin = cluster.deploy(node, devplug_plugin_spec)
        plugin.wait_ready(devplug_plugin_spec.gpus if devplug_plugin_spec.mock else None)
        yield plugin
    finally:
        backend.close()


@pytest.fixture
def sides(
    _sim_plugin: PluginHandle, devplug_plugin: PluginHandle, devplug_pod: PodFactory, request: pytest.FixtureRequest
) -> Iterator[tuple[Side, Side]]:
    """(sim, kind) for one scenario; the sim plugin is redeployed fresh for every test, like devplug_plugin."""
    backend = _sim_plugin.backend
    node = _sim_plugin.node
    backend.remove_plugin(node.name)
    cluster = ClusterHandle(backend, timeout=node.timeout)
    sim_plugin = cluster.deploy(node, _sim_plugin.spec)
    sim_plugin.wait_ready(_sim_plugin.spec.gpus if _sim_plugin.spec.mock else None)
    sim_pods = cluster.pods(node, sim_plugin.resource_name, prefix=request.node.name)
    try:
        yield Side("sim", sim_plugin, sim_pods), Side("kind", devplug_plugin, devplug_pod)
    finally:
        sim_pods.cleanup()


@pytest.fixture
def shared_sides(sides: tuple[Side, Side]) -> Iterator[tuple[Side, Side]]:
    """(sim, kind) with the included plugin on one mock GPU advertised as ``REPLICAS`` devices (``DP_REPLICAS``,
    set as an env var so the kind DaemonSet gets it too). The plugins are redeployed as the session's after the test."""
    out = []
    for s in sides:
        spec = dataclasses.replace(s.plugin.spec, env={**s.plugin.spec.env, "DP_REPLICAS": str(REPLICAS)}, gpus=1)
        s.plugin.mark_changed(
            devices=True
        )  # kind: the devplug_plugin fixture redeploys the session's plugin afterwards
        s.plugin.backend.remove_plugin(s.plugin.node.name)
        plugin = ClusterHandle(s.plugin.backend, timeout=s.plugin.node.timeout).deploy(s.plugin.node, spec)
        plugin.wait_ready(REPLICAS)
        plugin.mark_changed()
        out.append(Side(s.name, plugin, s.pods))
    yield out[0], out[1]
