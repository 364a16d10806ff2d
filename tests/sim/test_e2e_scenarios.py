"""The upstream device-plugin node e2e scenarios (facts §5) on the embedded kubelet with the real
GPU plugin; the grace period is shortened to keep them fast."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_devplug.sim.embeddedplane import EmbeddedPlane

from ._helpers import GPU, allocatable, gpu, phase, pod, pod_resources, start_gpu_node, wait_for, write_state

GRACE = 0.8


@pytest.fixture
def cluster() -> Iterator[EmbeddedPlane]:
    with EmbeddedPlane(grace_period=GRACE) as c:
        yield c


def devices_of(cluster: EmbeddedPlane, name: str) -> list[str]:
    cs = cluster.get_pod(name)["status"]["containerStatuses"][0]
    return sorted(r["resourceID"] for r in cs["allocatedResourcesStatus"][0]["resources"])


def test_registration_then_pod_sees_device_and_pod_resources_lists_it(cluster: EmbeddedPlane, tmp_path: Path) -> None:
    node = start_gpu_node(cluster, "node-1", tmp_path / "s.json", 2)
    assert allocatable(cluster, "node-1") == ("2", "2")
    cluster.create_pod(pod("x", 1))
    devs = devices_of(cluster, "x")
    assert (
        node.container(cluster.get_pod("x")["metadata"]["uid"], "main").options.envs["NVIDIA_VISIBLE_DEVICES"]
        == devs[0]
    )
    assert pod_resources(node) == {("x", "main"): {GPU: devs}}


def test_assignment_kept_across_container_kubelet_and_plugin_restarts(cluster: EmbeddedPlane, tmp_path: Path) -> None:
    node = start_gpu_node(cluster, "node-1", tmp_path / "s.json", 2)
    cluster.create_pod(pod("x", 1))
    devs = devices_of(cluster, "x")
    cluster.restart_container("x", "main")  # container restart
    assert devices_of(cluster, "x") == devs
    node.restart_kubelet()  # kubelet restart: the running container keeps its devices, no RPC
    assert phase(cluster, "x") == "Running" and devices_of(cluster, "x") == devs
    wait_for(lambda: allocatable(cluster, "node-1"), lambda v: v == ("2", "2"), "the plugin re-registered")
    cluster.restart_container("x", "main")  # pod (container) restart after the kubelet restart
    assert devices_of(cluster, "x") == devs
    node.plugin().restart()  # plugin restart
    wait_for(lambda: allocatable(cluster, "node-1"), lambda v: v == ("2", "2"), "2/2 after the plugin restart")
    assert devices_of(cluster, "x") == devs and pod_resources(node)[("x", "main")] == {GPU: devs}
    node.stop_kubelet()  # kubelet + plugin restart
    node.plugin().restart()
    node.start_kubelet()
    wait_for(lambda: allocatable(cluster, "node-1"), lambda v: v == ("2", "2"), "2/2 after kubelet+plugin restart")
    assert phase(cluster, "x") == "Running" and devices_of(cluster, "x") == devs
    cluster.create_pod(pod("y", 1))  # the other device only
    assert devices_of(cluster, "y") != devs


def test_succeeded_pod_is_not_readmitted_after_restart_without_plugin(cluster: EmbeddedPlane, tmp_path: Path) -> None:
    node = start_gpu_node(cluster, "node-1", tmp_path / "s.json", 1)
    cluster.create_pod(pod("done", 1, restart_policy="Never"))
    cluster.finish_container("done", "main", 0)
    node.plugin().stop()
    node.restart_kubelet()
    st = cluster.get_pod("done")["status"]
    assert st["phase"] == "Succeeded" and "reason" not in st


def test_pods_deleted_while_kubelet_down_are_cleaned_up(cluster: EmbeddedPlane, tmp_path: Path) -> None:
    node = start_gpu_node(cluster, "node-1", tmp_path / "s.json", 1)
    p = cluster.create_pod(pod("x", 1))
    node.stop_kubelet()
    cluster.delete_pod("x")
    assert node.containers(p["metadata"]["uid"])  # still on the node while its kubelet is down
    node.start_kubelet()
    assert node.containers(p["metadata"]["uid"]) == {}
    wait_for(lambda: allocatable(cluster, "node-1"), lambda v: v == ("1", "1"), "plugin re-registered")
    assert cluster.create_pod(pod("y", 1))["status"]["phase"] == "Running"  # the device was reclaimed
    assert pod_resources(node) == {("y", "main"): {GPU: devices_of(cluster, "y")}}


def test_reboot_without_reregistration_fails_the_pod(cluster: EmbeddedPlane, tmp_path: Path) -> None:
    node = start_gpu_node(cluster, "node-1", tmp_path / "s.json", 1)
    cluster.create_pod(pod("x", 1))
    node.reboot()  # sandboxes and the plugin are gone; the kubelet re-admits from its checkpoint
    st = cluster.get_pod("x")["status"]
    assert (st["phase"], st["reason"]) == ("Failed", "UnexpectedAdmissionError")
    assert st["message"] == (
        "Pod was rejected: Allocate failed due to no healthy devices present; cannot allocate "
        "unhealthy devices nvidia.com/gpu, which is unexpected"
    )


def test_device_unhealthy_then_healthy(cluster: EmbeddedPlane, tmp_path: Path) -> None:
    state = tmp_path / "s.json"
    start_gpu_node(cluster, "node-1", state, 1)
    write_state(state, [gpu(0, lost=True)])
    wait_for(lambda: allocatable(cluster, "node-1"), lambda v: v == ("1", "0"), "1/0 with the GPU lost")
    write_state(state, [gpu(0)])
    wait_for(lambda: allocatable(cluster, "node-1"), lambda v: v == ("1", "1"), "1/1 with the GPU back")


def test_list_and_watch_failure_zeroes_without_retry_then_grace_removes(cluster: EmbeddedPlane, tmp_path: Path) -> None:
    node = start_gpu_node(cluster, "node-1", tmp_path / "s.json", 2)
    node.plugin().kill(signal.SIGKILL)  # the stream breaks: capacity kept, allocatable 0, no re-dial
    wait_for(lambda: allocatable(cluster, "node-1"), lambda v: v == ("2", "0"), "2/0 after the stream ended")
    wait_for(lambda: allocatable(cluster, "node-1"), lambda v: v == ("0", "0"), f"0/0 after the {GRACE} s grace")
    assert cluster.create_pod(pod("x", 1))["status"]["phase"] == "Pending"
