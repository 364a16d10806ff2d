"""``sigs.k8s.io/dra-example-driver`` v0.2.1's kubelet plugin, built from its Go module, against the embedded
kubelet's DRA side, with its plain command line: the kubelet's standard paths (``/var/lib/kubelet/
plugins_registry``, ``/var/lib/kubelet/plugins``, ``/etc/cdi``) in a private mount namespace.

There is no API server here yet (the real control plane comes with ``--devplug-control-plane real``), so
this proves what works without one: the driver registers, the ``v1.DRAPlugin`` service is chosen and
connected, its DRA socket answers, and a prepare fails the way a driver that must read the claim from
the API fails. Publishing ResourceSlices and preparing a real claim need the API server.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pytest_devplug.api.dra import v1_pb2 as pb
from pytest_devplug.sim.dra.client import DRAPluginCallError
from pytest_devplug.sim.dra.plugins import DRAPluginManager
from pytest_devplug.sim.dra.watcher import DRA_PLUGIN_TYPE, PluginWatcher
from pytest_devplug.sim.process import PluginProcess, namespace_problem
from pytest_devplug.waiting import wait_for

DRIVER = "gpu.example.com"
KUBELET = "/var/lib/kubelet"
#: A kubeconfig whose server refuses connections: the driver starts its client without contacting it.
KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: none, user: {token: none}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
"""


@pytest.fixture
def node_root() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="dra-peer-", dir="/tmp") as root:
        yield Path(root)


@pytest.fixture
def example_driver(peer_binary: Callable[[str], Path], node_root: Path) -> Iterator[tuple[PluginProcess, DRAPluginManager, PluginWatcher]]:
    problem = namespace_problem()
    if problem is not None:
        pytest.skip(f"the driver's standard paths need a private mount namespace: {problem}")
    binary = peer_binary("dra-example-kubeletplugin")
    dirs = {name: node_root / name for name in ("plugins_registry", "plugins", "cdi")}
    for d in dirs.values():
        d.mkdir()
    (node_root / "kubeconfig").write_text(KUBECONFIG)

    def host_path(endpoint: str) -> Path:
        # the endpoint the driver names, in its mount namespace -> the same socket here
        for name in ("plugins_registry", "plugins"):
            prefix = f"{KUBELET}/{name}/"
            if endpoint.startswith(prefix):
                return dirs[name] / endpoint[len(prefix):]
        return Path(endpoint)

    plugins = DRAPluginManager("node-1", path_of_endpoint=host_path)
    watcher = PluginWatcher(dirs["plugins_registry"], {DRA_PLUGIN_TYPE: plugins}, poll_interval=0.02)
    watcher.start()
    proc = PluginProcess(
        [str(binary), "--node-name", "node-1", "--kubeconfig", str(node_root / "kubeconfig"), "-v", "4"],
        log_path=node_root / "driver.log",
        binds=[(dirs["plugins_registry"], f"{KUBELET}/plugins_registry"), (dirs["plugins"], f"{KUBELET}/plugins"), (dirs["cdi"], "/etc/cdi")],
    )
    proc.start()
    try:
        yield proc, plugins, watcher
    finally:
        proc.stop()
        watcher.stop()
        plugins.stop()


def test_example_driver_registers_with_its_plain_command_line(
    example_driver: tuple[PluginProcess, DRAPluginManager, PluginWatcher], node_root: Path
) -> None:
    proc, plugins, watcher = example_driver
    registered = wait_for(
        lambda: plugins.registered().get(DRIVER, []), bool, timeout=30.0, what=f"{DRIVER} registered",
        give_up=lambda: None if proc.running else f"the driver exited {proc.returncode}; its log:\n{proc.log()[-3000:]}",
    )
    assert registered == [str(node_root / "plugins" / DRIVER / "dra.sock")], proc.log()[-3000:]
    plugin = plugins.get_plugin(DRIVER)
    assert plugin.chosen_service == "v1.DRAPlugin"
    wait_for(lambda: plugins.usable(DRIVER), bool, timeout=10.0, what="the DRA socket connected")
    # the outcome is recorded just after the handler accepted the plugin
    (event,) = wait_for(lambda: [e for e in watcher.events if e.kind != "failed"], bool, timeout=10.0, what="the outcome recorded")
    assert event.kind == "registered" and event.socket.endswith(f"plugins_registry/{DRIVER}-reg.sock")


def test_example_driver_cannot_prepare_without_an_api_server(example_driver: tuple[PluginProcess, DRAPluginManager, PluginWatcher]) -> None:
    proc, plugins, _ = example_driver
    wait_for(lambda: plugins.usable(DRIVER), bool, timeout=30.0, what="the driver connected",
             give_up=lambda: None if proc.running else f"the driver exited; its log:\n{proc.log()[-3000:]}")
    claim = pb.Claim(namespace="default", uid="8e1b6a3c-0000-4000-8000-000000000001", name="gpu-claim")
    # the kubeletplugin helper reads the claim from the API server before the driver's own code runs,
    # and fails the whole call (not one claim) when it cannot
    with pytest.raises(DRAPluginCallError) as err:
        plugins.get_plugin(DRIVER).node_prepare_resources([claim])
    assert str(err.value).startswith("rpc error: code = Unknown desc = get resource claims: retrieve claim default/gpu-claim: "), err.value
    assert "127.0.0.1:1" in str(err.value)
