"""The embedded kubelet in the scenarios issue 17 added to the conformance suite, against upstream's rules:
the restartable-init case of ``device_plugin_test.go`` with ``manager.go``'s reuse, a server-ended stream
logged as upstream's client logs it, a SIGKILLed plugin's socket left in place by a running kubelet, and the
reboot order (pod re-admitted before the plugin, then the plugin back with the checkpoint's IDs)."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pytest_devplug.sim.embeddedplane import EmbeddedPlane
from pytest_devplug.sim.devicemanager import DeviceManager

from ._helpers import GPU, allocatable, pod, pod_resources, start_gpu_node, wait_for
from .dm_helpers import GPU as FAKE_RESOURCE
from .dm_helpers import DmWaiter, FakePlugin

Make = Callable[..., tuple[DeviceManager, DmWaiter]]


@pytest.fixture
def cluster() -> Iterator[EmbeddedPlane]:
    with EmbeddedPlane(grace_period=30.0) as c:
        yield c


def _one(name: str, *, sidecar: bool = False) -> dict[str, object]:
    c: dict[str, object] = {"name": name, "image": "busybox", "resources": {"limits": {GPU: 1}}}
    if sidecar:
        c["restartPolicy"] = "Always"
    return c


def test_restartable_init_container_reuses_the_init_device_and_keeps_it(cluster: EmbeddedPlane, tmp_path: Path) -> None:
    """Upstream: init-1 and restartable-init-2 share one device, regular-1 gets another; pod-resources lists
    the restartable init container and the regular one, not the plain init container."""
    node = start_gpu_node(cluster, "node-1", tmp_path / "s.json", 2)
    body = pod("p", 1, init=[_one("init-1"), _one("restartable-init-2", sidecar=True)])
    body["spec"]["containers"][0]["name"] = "regular-1"
    p = cluster.create_pod(body)
    assert p["status"]["phase"] == "Running", p["status"]
    uid = p["metadata"]["uid"]
    devs = {c: node.container(uid, c).devices[GPU] for c in ("init-1", "restartable-init-2", "regular-1")}
    assert devs["restartable-init-2"] == devs["init-1"] and len(devs["init-1"]) == 1, devs
    assert set(devs["regular-1"]).isdisjoint(devs["restartable-init-2"]), devs
    listed = {c: ids for (name, c), ids in pod_resources(node).items() if name == "p"}
    assert listed == {"restartable-init-2": {GPU: devs["restartable-init-2"]}, "regular-1": {GPU: devs["regular-1"]}}
    assert cluster.create_pod(pod("q", 1))["status"]["phase"] == "Pending"  # both devices held


def test_stream_ended_by_the_server_is_logged_with_eof_and_never_redialled(
    dm_make: Make, dm_fake: Callable[..., FakePlugin], caplog: pytest.LogCaptureFixture
) -> None:
    """A Go client's ``Recv()`` returns ``io.EOF`` when the server returns; the kubelet logs that error."""
    dm, w = dm_make()
    f = dm_fake()
    f.register()
    w.until("registered", lambda: dm.capacity()[1].get(FAKE_RESOURCE), lambda n: n == 2)
    with caplog.at_level("WARNING"):
        f.end_stream()
        w.until("allocatable 0 after the stream ended", lambda: dm.capacity()[1].get(FAKE_RESOURCE), lambda n: n == 0)
    assert any(
        r.getMessage() == f"ListAndWatch ended unexpectedly for device plugin {FAKE_RESOURCE}: EOF"
        for r in caplog.records
    ), [r.getMessage() for r in caplog.records]
    assert f.law_calls == 1


def test_sigkilled_plugin_leaves_its_socket_and_registers_again_on_it(cluster: EmbeddedPlane, tmp_path: Path) -> None:
    """A running kubelet removes no socket (only its own start cleans the directory): the killed plugin's socket
    stays, and the plugin started again must serve on that path before it registers."""
    node = start_gpu_node(cluster, "node-1", tmp_path / "s.json", 2)
    sockets = {s.name for s in node.plugin_dir.glob("*.sock")} - {"kubelet.sock"}
    assert sockets, list(node.plugin_dir.iterdir())
    node.plugin().kill(signal.SIGKILL)
    node.plugin().wait(timeout=5)
    wait_for(lambda: allocatable(cluster, "node-1"), lambda v: v == ("2", "0"), "2/0 after SIGKILL")
    assert {s.name for s in node.plugin_dir.glob("*.sock")} >= sockets | {"kubelet.sock"}  # left behind
    node.plugin().start()
    wait_for(lambda: allocatable(cluster, "node-1"), lambda v: v == ("2", "2"), "2/2 after the restart")
    assert cluster.create_pod(pod("x", 2))["status"]["phase"] == "Running"


def test_reboot_then_plugin_back_keeps_the_checkpointed_ids(cluster: EmbeddedPlane, tmp_path: Path) -> None:
    node = start_gpu_node(cluster, "node-1", tmp_path / "s.json", 2)
    uid = cluster.create_pod(pod("x", 1))["metadata"]["uid"]
    held = node.container(uid, "main").devices[GPU]
    node.reboot()
    st = cluster.get_pod("x")["status"]
    assert (st["phase"], st["reason"]) == ("Failed", "UnexpectedAdmissionError"), st
    assert node.containers(uid) == {}  # the reboot took the containers
    node.plugin().start()
    wait_for(lambda: allocatable(cluster, "node-1"), lambda v: v == ("2", "2"), "2/2 after the plugin came back")
    assert cluster.create_pod(pod("y", 2))["status"]["phase"] == "Running"  # the failed pod's device is free again
    assert set(held) <= set(node.container(cluster.get_pod("y")["metadata"]["uid"], "main").devices[GPU])
