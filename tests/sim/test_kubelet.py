"""SimNode's kubelet against the real GPU plugin subprocess: admission order and texts, container
records, node status, health in allocatedResourcesStatus, init containers, restarts."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_devplug.sim.embeddedplane import EmbeddedPlane

from ._helpers import GPU, allocatable, gpu, phase, pod, start_gpu_node, wait_for, write_state


@pytest.fixture
def cluster() -> Iterator[EmbeddedPlane]:
    with EmbeddedPlane(grace_period=0.6) as c:
        yield c


def test_admitted_container_gets_what_allocate_returned(cluster: EmbeddedPlane, tmp_path: Path) -> None:
    node = start_gpu_node(cluster, "node-1", tmp_path / "s.json", 2)
    p = cluster.create_pod(pod("x", 1))
    assert p["spec"]["nodeName"] == "node-1" and p["status"]["phase"] == "Running"
    cs = p["status"]["containerStatuses"][0]
    assert cs["ready"] and cs["restartCount"] == 0 and "running" in cs["state"]
    (res,) = cs["allocatedResourcesStatus"]
    assert res["name"] == GPU and res["resources"][0]["health"] == "Healthy"
    dev_id = res["resources"][0]["resourceID"]
    rec = node.container(p["metadata"]["uid"], "main")
    assert rec.devices == {GPU: [dev_id]}
    assert rec.options.envs["NVIDIA_VISIBLE_DEVICES"] == dev_id
    assert any(d.container_path.startswith("/dev/nvidia") and d.permissions for d in rec.options.devices)
    reasons = [e["reason"] for e in cluster.events(involved_name="x")]
    assert reasons == ["Scheduled", "Created", "Started"]


def test_node_name_bypass_with_too_few_devices_is_rejected_by_the_device_manager(
    cluster: EmbeddedPlane, tmp_path: Path
) -> None:
    start_gpu_node(cluster, "node-1", tmp_path / "s.json", 1)
    p = cluster.create_pod(pod("big", 2, node_name="node-1"))
    st = p["status"]
    # The allocate handler runs before the predicate handler (kubelet.go), so not OutOfnvidia.com/gpu.
    assert (st["phase"], st["reason"]) == ("Failed", "UnexpectedAdmissionError")
    assert st["message"] == (
        "Pod was rejected: Allocate failed due to requested number of devices unavailable for "
        "nvidia.com/gpu. Requested: 2, Available: 1, which is unexpected"
    )
    assert "containerStatuses" not in st
    (ev,) = [e for e in cluster.events(involved_name="big") if e["type"] == "Warning"]
    assert ev["reason"] == "UnexpectedAdmissionError" and ev["message"] == st["message"].removeprefix(
        "Pod was rejected: "
    )
    assert ev["source"] == {"component": "kubelet", "host": "node-1"}
    assert not any(e["reason"] == "Scheduled" for e in cluster.events(involved_name="big"))


def test_predicate_handler_out_of_cpu_and_node_affinity(cluster: EmbeddedPlane) -> None:
    cluster.add_node("node-1")
    cpu_hog = pod("hog", None, node_name="node-1")
    cpu_hog["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "16"}}
    st = cluster.create_pod(cpu_hog)["status"]
    assert (st["phase"], st["reason"]) == ("Failed", "OutOfcpu")
    assert (
        st["message"]
        == "Pod was rejected: Node didn't have enough resource: cpu, requested: 16000, used: 0, capacity: 8000"
    )
    st = cluster.create_pod(pod("sel", None, node_name="node-1", nodeSelector={"zone": "nowhere"}))["status"]
    assert (st["reason"], st["message"]) == ("NodeAffinity", "Pod was rejected: Predicate NodeAffinity failed")


def test_node_status_and_health_changes(cluster: EmbeddedPlane, tmp_path: Path) -> None:
    state = tmp_path / "s.json"
    start_gpu_node(cluster, "node-1", state, 2)
    n = cluster.get_node("node-1")
    assert n["status"]["capacity"] == {"cpu": "8", "memory": "32Gi", "pods": "110", GPU: "2"}
    assert n["metadata"]["labels"]["kubernetes.io/hostname"] == "node-1"
    assert n["status"]["conditions"][0]["type"] == "Ready" and n["status"]["conditions"][0]["status"] == "True"
    p = cluster.create_pod(pod("x", 1))
    held = p["status"]["containerStatuses"][0]["allocatedResourcesStatus"][0]["resources"][0]["resourceID"]
    idx = int(held.split("-")[1])
    write_state(state, [gpu(i, numa=i % 2, lost=(i == idx)) for i in range(2)])
    wait_for(lambda: allocatable(cluster, "node-1"), lambda v: v == ("2", "1"), "capacity 2, allocatable 1")
    res = wait_for(
        lambda: cluster.get_pod("x")["status"]["containerStatuses"][0]["allocatedResourcesStatus"][0]["resources"][0],
        lambda r: r["health"] == "Unhealthy",
        "the held device reported Unhealthy",
    )
    assert res["resourceID"] == held
    assert phase(cluster, "x") == "Running"  # an unhealthy device does not evict its pod


def test_init_containers_are_admitted_first_and_complete(cluster: EmbeddedPlane, tmp_path: Path) -> None:
    node = start_gpu_node(cluster, "node-1", tmp_path / "s.json", 2)
    init = [{"name": "setup", "image": "busybox", "resources": {"limits": {GPU: 2}}}]
    p = cluster.create_pod(pod("x", 1, init=init))
    (ist,) = p["status"]["initContainerStatuses"]
    assert ist["state"]["terminated"]["reason"] == "Completed" and "allocatedResourcesStatus" not in ist
    assert p["status"]["phase"] == "Running"
    setup = node.container(p["metadata"]["uid"], "setup").devices[GPU]
    main = node.container(p["metadata"]["uid"], "main").devices[GPU]
    assert len(setup) == 2 and len(main) == 1 and set(main) <= set(setup)  # init devices are reused


def test_container_restart_keeps_devices_and_finish_frees_them(cluster: EmbeddedPlane, tmp_path: Path) -> None:
    node = start_gpu_node(cluster, "node-1", tmp_path / "s.json", 1)
    p = cluster.create_pod(pod("x", 1, restart_policy="Never"))
    uid = p["metadata"]["uid"]
    before = node.container(uid, "main").devices
    cs = cluster.restart_container("x", "main")["status"]["containerStatuses"][0]
    assert cs["restartCount"] == 1 and cs["lastState"]["terminated"]["exitCode"] == 137
    assert node.container(uid, "main").devices == before
    assert cluster.create_pod(pod("y", 1))["status"]["phase"] == "Pending"
    st = cluster.finish_container("x", "main", 0)["status"]
    assert st["phase"] == "Succeeded" and st["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    # the succeeded pod's device goes to the waiting pod (reclaimed before the next allocation)
    wait_for(lambda: phase(cluster, "y"), lambda v: v == "Running", "pod y running on the freed GPU")
    assert node.container(cluster.get_pod("y")["metadata"]["uid"], "main").devices == before


def test_restart_policy_always_restarts_a_finished_container(cluster: EmbeddedPlane, tmp_path: Path) -> None:
    start_gpu_node(cluster, "node-1", tmp_path / "s.json", 1)
    cluster.create_pod(pod("x", 1))
    st = cluster.finish_container("x", "main", 1)["status"]
    assert st["phase"] == "Running" and st["containerStatuses"][0]["restartCount"] == 1


def test_pre_start_container_is_called_when_required(cluster: EmbeddedPlane, tmp_path: Path) -> None:
    node = start_gpu_node(cluster, "node-1", tmp_path / "s.json", 1, "--pre-start-required")
    cluster.create_pod(pod("x", 1))
    assert phase(cluster, "x") == "Running"
    assert "PreStartContainer" in node.kubelet_log()


def test_failing_pre_start_container_keeps_the_container_from_starting(cluster: EmbeddedPlane, tmp_path: Path) -> None:
    """``GetDeviceRunContainerOptions`` fails: kuberuntime reports ``CreateContainerConfigError`` with the device
    manager's error, the container never runs, the pod (admitted, devices held) stays Pending."""
    state = tmp_path / "s.json"
    write_state(state, [gpu(0, fail_pre_start=True)])
    start_gpu_node(cluster, "node-1", state, 1, "--pre-start-required")
    st = cluster.create_pod(pod("x", 1))["status"]
    assert st["phase"] == "Pending"
    (cs,) = st["containerStatuses"]
    waiting = cs["state"]["waiting"]
    assert waiting["reason"] == "CreateContainerConfigError" and not cs["started"], cs
    assert waiting["message"].startswith(
        "device plugin PreStartContainer rpc failed with err: rpc error: code = Internal desc = "
    )
    assert "fail_pre_start is set for GPU-0000" in waiting["message"]
    assert cs["allocatedResourcesStatus"] == [
        {"name": GPU, "resources": [{"resourceID": "GPU-0000", "health": "Healthy"}]}
    ]
    failed = [e["message"] for e in cluster.events(involved_name="x") if e["reason"] == "Failed"]
    assert failed == [f"Error: {waiting['message']}"]


@pytest.mark.parametrize("image", ["devplug.invalid/none:1", "invalid.registry.k8s.io/invalid/alpine:3.1"])
def test_unpullable_image_never_starts_yet_reports_its_device_health(
    cluster: EmbeddedPlane, tmp_path: Path, image: str
) -> None:
    """Upstream's "Device Status for the failed pod": an image from a registry that cannot exist is never pulled
    (``ImagePullBackOff``, PreStartContainer never called), the container holds its device from admission on, and
    allocatedResourcesStatus follows the device's health."""
    state = tmp_path / "s.json"
    node = start_gpu_node(cluster, "node-1", state, 1, "--pre-start-required")
    body = pod("x", 1)
    body["spec"]["containers"][0]["image"] = image
    st = cluster.create_pod(body)["status"]
    assert st["phase"] == "Pending"
    (cs,) = st["containerStatuses"]
    waiting = cs["state"]["waiting"]
    assert waiting["reason"] == "ImagePullBackOff", cs
    assert waiting["message"].startswith(
        f'Back-off pulling image "{image}": ErrImagePull: rpc error: code = Unknown desc = '
    )
    assert "no such host" in waiting["message"]
    events = [(e["reason"], e["message"]) for e in cluster.events(involved_name="x")]
    assert events[1:3] == [
        ("Pulling", f'Pulling image "{image}"'),
        ("Failed", f'Failed to pull image "{image}": ' + waiting["message"].split("ErrImagePull: ", 1)[1]),
    ]
    assert ("BackOff", f'Back-off pulling image "{image}"') in events and (
        "Failed",
        "Error: ImagePullBackOff",
    ) in events
    assert "PreStartContainer" not in node.kubelet_log(), "the image is pulled before PreStartContainer"
    assert cs["allocatedResourcesStatus"] == [
        {"name": GPU, "resources": [{"resourceID": "GPU-0000", "health": "Healthy"}]}
    ]
    write_state(state, [gpu(0, lost=True)])
    res = wait_for(
        lambda: cluster.get_pod("x")["status"]["containerStatuses"][0]["allocatedResourcesStatus"][0]["resources"][0],
        lambda r: r["health"] == "Unhealthy",
        "the never-started container's device reported Unhealthy",
    )
    assert res["resourceID"] == "GPU-0000" and phase(cluster, "x") == "Pending"


def test_images_of_real_registries_are_pulled() -> None:
    from pytest_devplug.sim.runtime import image_pull_error

    for image in (
        "busybox:1.36",
        "registry.k8s.io/pause:3.10",
        "localhost:5000/x",
        "my.invalid.example.com/x:1",
        "invalid/x",
    ):
        assert image_pull_error(image) is None, image
    assert image_pull_error("devplug.invalid:5000/x") is not None


def test_kubelet_log_is_klog_formatted(cluster: EmbeddedPlane) -> None:
    node = cluster.add_node("node-1")
    lines = node.kubelet_log().splitlines()
    assert lines and all(re.match(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ \w+\.py:\d+\] ", ln) for ln in lines)
    assert (node.node_dir / "kubelet.log").read_text().splitlines()[0] == lines[0]


def test_stopped_plugin_goes_unhealthy_then_removed_after_grace(tmp_path: Path) -> None:
    # The grace period starts long, so 2/0 is seen however slow the poll, then is cut short: a 0.6 s grace
    # period could end before a busy machine's first look, and 2/0 would never be seen.
    with EmbeddedPlane(grace_period=300.0) as cluster:
        node = start_gpu_node(cluster, "node-1", tmp_path / "s.json", 2)
        node.plugin().stop()
        wait_for(lambda: allocatable(cluster, "node-1"), lambda v: v == ("2", "0"), "capacity kept, allocatable 0")
        assert node.device_manager is not None
        node.device_manager.grace_period = 0.3
        wait_for(
            lambda: allocatable(cluster, "node-1"),
            lambda v: v == ("0", "0"),
            "the resource removed (shown as 0/0) after the grace period",
        )
