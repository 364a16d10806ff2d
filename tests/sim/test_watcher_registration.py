"""Device plugins that register through the kubelet's plugin watcher (a socket in ``plugins_registry/`` answering
``GetInfo`` with type ``DevicePlugin``), as upstream's ``devicemanager/plugin/v1beta1/handler.go`` takes them:
validation (a version the kubelet speaks, an extended resource name), the endpoint from ``GetInfo`` (empty: the
registration socket), deregistration when the socket goes, registration again after a kubelet restart."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_devplug import PluginSpec, assert_registered, assert_reregisters_after_kubelet_restart
from pytest_devplug.assertions import registration_path
from pytest_devplug.backends.base import NodeSpec
from pytest_devplug.handles import ClusterHandle, PluginHandle
from pytest_devplug.sim.pluginwatcher import DEVICE_PLUGIN_TYPE
from pytest_devplug.waiting import wait_for

from ..support import sim_cluster

WIDGET = str(Path(__file__).resolve().parents[1] / "fixture_plugins" / "widget.py")
RESOURCE = "example.com/widget"
TIMEOUT = 20.0


@pytest.fixture
def cluster() -> Iterator[ClusterHandle]:
    with sim_cluster(TIMEOUT) as cluster:
        yield cluster


def deploy(cluster: ClusterHandle, *args: str, standard_paths: bool = False) -> PluginHandle:
    node = cluster.ensure_node(NodeSpec("n1"))
    dirs = [] if standard_paths else ["--plugin-dir", "{plugin_dir}", "--registry-dir", "{plugins_registry}"]
    argv = [sys.executable, WIDGET, "--registration", "plugins_registry", *dirs, *args]
    return cluster.deploy(node, PluginSpec(resource_name=RESOURCE, argv=argv))


def sim_node(plugin: PluginHandle):  # type: ignore[no-untyped-def]
    return plugin.node.backend.cluster.node(plugin.node.name)  # type: ignore[attr-defined]


def test_registered_through_the_watcher_and_again_after_a_kubelet_restart(cluster: ClusterHandle) -> None:
    plugin = deploy(cluster, "--count", "2")
    assert assert_registered(plugin) == (2, 2)
    node = sim_node(plugin)
    # The watcher records the outcome once the plugin heard it (after the device manager connected).
    wait_for(
        lambda: [(e.kind, e.plugin_type, e.name) for e in node.registration_events()],
        lambda events: events == [("registered", DEVICE_PLUGIN_TYPE, RESOURCE)],
        timeout=TIMEOUT,
        what="the registration",
    )
    assert registration_path(plugin.node, RESOURCE) == "plugins_registry"
    # no DEPRECATION file: upstream's stub would skip Register (the kubelet never calls GetPluginHandler, which
    # makes it)
    assert sorted(p.name for p in node.plugin_dir.iterdir()) == ["kubelet.sock", "kubelet_internal_checkpoint"]
    wait_for(
        plugin.log,
        lambda log: "widget: the plugin watcher says registered" in log,
        timeout=TIMEOUT,
        what="the verdict told",
    )
    assert_reregisters_after_kubelet_restart(plugin, count=2)  # the plugin does nothing: the new watcher finds it
    wait_for(
        lambda: [e.kind for e in node.registration_events()],
        lambda k: k == ["registered", "registered"],
        timeout=TIMEOUT,
        what="a second registration, by the restarted kubelet's watcher",
    )


def test_the_endpoint_is_a_path_in_the_plugins_namespace(cluster: ClusterHandle) -> None:
    """A plugin with the kubelet's paths hard-coded runs in a namespace of its own; the endpoint it names is mapped to
    the node's directory, as the kubelet, on the same filesystem, opens it."""
    plugin = deploy(cluster, standard_paths=True)
    assert assert_registered(plugin) == (3, 3)
    assert "widget: serving /var/lib/kubelet/plugins_registry/widget.sock" in plugin.log()


def test_socket_removed_deregisters_the_plugin(cluster: ClusterHandle) -> None:
    """The plugin's socket gone: the watcher deregisters it and the device manager disconnects it (its devices
    unhealthy: allocatable 0, capacity kept for the grace period), as when its stream ends."""
    plugin = deploy(cluster)
    assert_registered(plugin)
    plugin.stop()  # SIGTERM: the widget removes its socket
    node = plugin.node
    wait_for(
        lambda: node.counts(RESOURCE),
        lambda c: c == (3, 0),
        timeout=TIMEOUT,
        what="devices unhealthy after deregistration",
    )
    # the stream's end comes first; the watcher sees the socket gone on its next scan
    wait_for(
        lambda: [e.kind for e in sim_node(plugin).registration_events()],
        lambda kinds: kinds == ["registered", "deregistered"],
        timeout=TIMEOUT,
        what="the plugin deregistered",
    )


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["--info-version", "v1alpha1"], "manager version, v1beta1, is not among plugin supported versions [v1alpha1]"),
        (["--resource-name", "widget"], 'invalid name of device plugin socket: the ResourceName "widget" is invalid'),
    ],
)
def test_a_plugin_the_watcher_refuses_is_told_why_and_the_check_says_so(
    cluster: ClusterHandle, args: list[str], reason: str
) -> None:
    plugin = deploy(cluster, *args)
    with pytest.raises(AssertionError) as info:
        assert_registered(plugin, timeout=5)
    text = str(info.value)
    assert "the kubelet's plugin watcher did not register it from plugins_registry/" in text, text
    assert reason in text, text
    wait_for(
        plugin.log,
        lambda log: (
            f"the plugin watcher says RegisterPlugin error -- plugin validation failed with err: {reason}" in log
        ),
        timeout=TIMEOUT,
        what="the plugin told the reason",
    )
