"""The GPU plugin as a DRA driver against the real control plane (etcd, kube-apiserver, kube-scheduler,
kube-controller-manager v1.34), with the kubelet's DRA side built from the harness's building blocks
(``pytest_devplug.sim.dra``: plugin watcher, plugin manager, DRA manager reading claims from the API):
the ResourceSlice it publishes, a claim the real scheduler allocates from it, prepared, resolved by CDI as
a runtime would, unprepared; the slice following the GPUs; slices a restarting kubelet wipes published again.

One control plane and one driver for the module (they take most of its time); each test leaves the
driver as it found it.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from pytest_devplug.controlplane import ControlPlane
from pytest_devplug.nvml import mock_env
from pytest_devplug.kubeletmodel.cdi import resolve as resolve_cdi
from pytest_devplug.sim.dra.manager import DRAManager
from pytest_devplug.sim.dra.plugins import DRAPluginManager
from pytest_devplug.waiting import wait_for

from ..support import WAIT, control_plane_binaries, wait_until
from .dra_helpers import DRIVER, NODE, DriverDirs, KubeletSide, driver_dirs
from .gpu_plugin_helpers import UUIDS, MockStateFile, PluginProcess

NOT_READY = "node.kubernetes.io/not-ready"


def _json(resp: Any) -> Any:
    return json.loads(resp.data)


class Api:
    """The few API calls these tests make, as JSON; also the kubelet's ClaimSource and ResourceSliceWiper."""

    def __init__(self, client: Any, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self.core = kubernetes.client.CoreV1Api(client)
        self.resource = kubernetes.client.ResourceV1Api(client)

    def get_resource_claim(self, namespace: str, name: str) -> dict[str, Any]:
        return dict(_json(self.resource.read_namespaced_resource_claim(name, namespace, _preload_content=False)))

    def delete_resource_slices(self, node_name: str, driver: str | None) -> None:
        selector = f"spec.nodeName={node_name}" + (f",spec.driver={driver}" if driver else "")
        self.resource.delete_collection_resource_slice(field_selector=selector)

    def slices(self) -> list[dict[str, Any]]:
        resp = self.resource.list_resource_slice(
            field_selector=f"spec.driver={DRIVER},spec.nodeName={NODE}", _preload_content=False
        )
        return list(_json(resp)["items"])

    def pod(self, name: str) -> dict[str, Any]:
        return dict(_json(self.core.read_namespaced_pod(name, "default", _preload_content=False)))


def _register_node(api: Api, stop: threading.Event) -> threading.Thread:
    """A Node the scheduler places pods on: Ready, with room for pods, its heartbeat posted every 10 s until
    ``stop`` (the node lifecycle controller lifts the not-ready taint the API server put on it, and keeps it
    off). Whole-object updates, no patches: which patch types a call accepts differs between client releases."""
    api.core.create_node(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}}}
    )
    room = {"cpu": "8", "memory": "32Gi", "pods": "110"}
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    def heartbeat() -> None:
        while True:
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            ready = {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "kubelet is posting ready status",
                "lastHeartbeatTime": now,
                "lastTransitionTime": since,
            }
            status = {"capacity": room, "allocatable": room, "conditions": [ready]}
            api.core.replace_node_status(
                NODE, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}, "status": status}
            )
            if stop.wait(10.0):
                return

    heartbeat_thread = threading.Thread(target=heartbeat, name="node-heartbeat", daemon=True)
    heartbeat_thread.start()

    def taints() -> list[str]:
        node = _json(api.core.read_node(NODE, _preload_content=False))
        return [str(t.get("key")) for t in (node.get("spec") or {}).get("taints") or []]

    wait_until(
        f"the node lifecycle controller to lift the {NOT_READY} taint of {NODE}",
        taints,
        lambda keys: NOT_READY not in keys,
    )
    return heartbeat_thread


@pytest.fixture(scope="module")
def api() -> Iterator[Api]:
    stop = threading.Event()
    with ControlPlane(control_plane_binaries()) as cp:
        client = cp.client()
        try:
            api = Api(client, cp.kubeconfig)
            heartbeat = _register_node(api, stop)
            try:
                yield api
            finally:
                stop.set()
                heartbeat.join(5)
        finally:
            client.close()


@pytest.fixture(scope="module")
def dirs() -> Iterator[DriverDirs]:
    with driver_dirs() as d:
        yield d


@pytest.fixture(scope="module")
def mock_gpus(dirs: DriverDirs) -> MockStateFile:
    return MockStateFile(dirs.root / "mock-state.json")


@pytest.fixture(scope="module")
def driver(api: Api, dirs: DriverDirs, mock_gpus: MockStateFile) -> Iterator[PluginProcess]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DP_")}
    env.update(mock_env(str(mock_gpus.path)))
    args = [*dirs.args(api.kubeconfig), "--nvml", "mock", "--mock-state", str(mock_gpus.path)]
    proc = PluginProcess(args, dirs.root / "driver.log", env)
    try:
        yield proc
    finally:
        proc.cleanup()


@pytest.fixture(scope="module")
def kubelet(api: Api, dirs: DriverDirs, driver: PluginProcess) -> Iterator[KubeletSide]:
    side = KubeletSide(dirs, api)
    try:
        side.wait_usable(lambda: None if driver.proc.poll() is None else f"the driver exited:\n{driver.log()[-3000:]}")
        yield side
    finally:
        side.stop()


def _devices(slice_: dict[str, Any]) -> list[str]:
    return [d["name"] for d in slice_["spec"]["devices"]]


def _one_slice(
    api: Api, driver: PluginProcess, ok: Any = lambda s: True, what: str = "the driver's ResourceSlice"
) -> dict[str, Any]:
    """The node's one slice of the driver once ``ok`` holds for it (given up at once should the driver exit)."""
    __tracebackhide__ = True
    found = wait_for(
        api.slices,
        lambda items: len(items) == 1 and ok(items[0]),
        timeout=WAIT,
        what=what,
        give_up=lambda: None if driver.proc.poll() is None else f"the driver exited:\n{driver.log()[-3000:]}",
    )
    return dict(found[0])


def test_the_node_gets_one_slice_with_a_device_per_gpu(api: Api, driver: PluginProcess, kubelet: KubeletSide) -> None:
    s = _one_slice(api, driver, lambda s: len(s["spec"]["devices"]) == 4)
    spec, meta = s["spec"], s["metadata"]
    assert (spec["driver"], spec["nodeName"], spec["pool"]["name"], spec["pool"]["resourceSliceCount"]) == (
        DRIVER,
        NODE,
        NODE,
        1,
    )
    assert meta["name"].startswith(f"{NODE}-{DRIVER}-")
    node_uid = _json(api.core.read_node(NODE, _preload_content=False))["metadata"]["uid"]
    assert meta["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node_uid, "controller": True}
    ]
    assert _devices(s) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert spec["devices"][2] == {
        "name": "gpu-2",
        "attributes": {"uuid": {"string": UUIDS[2]}, "model": {"string": "NVIDIA A100-SXM4-40GB"}, "minor": {"int": 2}},
        "capacity": {"memory": {"value": "40Gi"}},
    }


def test_a_claim_allocated_by_the_scheduler_is_prepared_resolved_and_unprepared(
    api: Api, driver: PluginProcess, kubelet: KubeletSide, dirs: DriverDirs, mock_gpus: MockStateFile
) -> None:
    _one_slice(api, driver)
    api.resource.create_device_class(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": DRIVER},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        }
    )
    # the scheduler reads what the slice publishes: the minor and the memory capacity pick gpu-1
    pick = (
        f'device.attributes["{DRIVER}"].minor == 1 && '
        f'device.capacity["{DRIVER}"].memory.compareTo(quantity("40Gi")) >= 0'
    )
    api.resource.create_namespaced_resource_claim(
        "default",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "gpu-claim"},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {"deviceClassName": DRIVER, "selectors": [{"cel": {"expression": pick}}]},
                        }
                    ]
                }
            },
        },
    )
    api.core.create_namespaced_pod(
        "default",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "gpu-pod"},
            "spec": {
                "containers": [{"name": "ctr", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu-claim"}],
            },
        },
    )
    pod = wait_until(
        "gpu-pod bound to the node by the scheduler",
        lambda: api.pod("gpu-pod"),
        lambda p: p["spec"].get("nodeName") == NODE,
    )
    claim = api.get_resource_claim("default", "gpu-claim")
    uid = claim["metadata"]["uid"]
    assert claim["status"]["allocation"]["devices"]["results"] == [
        {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-1"}
    ]
    assert [r["uid"] for r in claim["status"]["reservedFor"]] == [pod["metadata"]["uid"]]

    manager = DRAManager(dirs.root / "kubelet", kubelet.plugins, api, health_cache=kubelet.health)
    manager.prepare_resources(pod)
    kind = f"{DRIVER}/gpu"
    ids = manager.container_cdi_devices(pod, "ctr")
    assert ids == [f"{kind}={uid}-gpu-1", f"{kind}={uid}-req-gpu"]
    edits = resolve_cdi(ids, [dirs.cdi])
    assert edits.env == {"NVIDIA_VISIBLE_DEVICES": UUIDS[1]}
    assert {n.container_path for n in edits.device_nodes} == {"/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"}
    (info,) = manager.claim_infos()
    assert [(d.pool_name, d.device_name, d.request_names) for d in (info.driver_state or {})[DRIVER] or []] == [
        (NODE, "gpu-1", ["gpu"])
    ]
    # the device's health reaches the pod's status
    status = lambda: manager.allocated_resources_status(pod, "ctr")  # noqa: E731
    wait_until(
        "gpu-1 Healthy in allocatedResourcesStatus", status, lambda s: s and s[0]["resources"][0]["health"] == "Healthy"
    )
    mock_gpus.xid(UUIDS[1], 79)
    seen = wait_until(
        "gpu-1 Unhealthy in allocatedResourcesStatus",
        status,
        lambda s: s and s[0]["resources"][0]["health"] == "Unhealthy",
    )
    assert seen == [
        {"name": "claim:gpu", "resources": [{"resourceID": ids[0], "health": "Unhealthy", "message": "Xid 79"}]}
    ]

    # a restarted kubelet prepares again from its checkpoint: the driver answers the same
    again = DRAManager(dirs.root / "kubelet", kubelet.plugins, api, health_cache=kubelet.health)
    again.prepare_resources(pod)
    assert again.container_cdi_devices(pod, "ctr") == ids
    assert driver.log().count(f"NodePrepareResources: claim default/gpu-claim ({uid}): gpu-1") == 2

    again.unprepare_resources(pod)
    assert again.claim_infos() == []
    assert not (dirs.cdi / f"{DRIVER}-gpu_{uid}.json").exists()
    driver.wait_log(f"NodeUnprepareResources: claim default/gpu-claim ({uid})")
    api.core.delete_namespaced_pod("gpu-pod", "default", grace_period_seconds=0)
    api.resource.delete_namespaced_resource_claim("gpu-claim", "default")


def test_the_slice_follows_gpus_added_and_removed(
    api: Api, driver: PluginProcess, kubelet: KubeletSide, mock_gpus: MockStateFile
) -> None:
    before = _one_slice(api, driver, lambda s: len(s["spec"]["devices"]) == 4)
    extra = {**mock_gpus.gpus[0], "uuid": "GPU-40000000-0000-4000-8000-000000000004", "minor": 4, "numa_node": None}
    mock_gpus.gpus.append(extra)
    mock_gpus.write()
    grown = _one_slice(api, driver, lambda s: "gpu-4" in _devices(s), "gpu-4 in the slice")
    mock_gpus.gpus.remove(extra)
    mock_gpus.write()
    shrunk = _one_slice(api, driver, lambda s: "gpu-4" not in _devices(s), "gpu-4 gone from the slice")
    # updated in place, one write each: same object, same pool generation (the Go controller's rule)
    assert grown["metadata"]["uid"] == shrunk["metadata"]["uid"] == before["metadata"]["uid"]
    assert (
        grown["spec"]["pool"]["generation"]
        == shrunk["spec"]["pool"]["generation"]
        == before["spec"]["pool"]["generation"]
    )
    assert _devices(shrunk) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    # two writes, no more: what the server stores ("40Gi" for "40960Mi") reads as equal to what was sent
    time.sleep(1.0)
    assert driver.log().count(f"ResourceSlice {before['metadata']['name']} updated (") == 2, driver.log()[-3000:]


def test_slices_a_restarting_kubelet_wipes_are_published_again(
    api: Api, driver: PluginProcess, kubelet: KubeletSide
) -> None:
    before = _one_slice(api, driver)
    restarted = DRAPluginManager(NODE, wiper=api)  # a kubelet's start deletes all of its node's slices
    try:
        wait_until("the restarted kubelet's wipe", lambda: restarted.wiped, lambda w: w == [None])
        started = time.monotonic()
        again = _one_slice(
            api, driver, lambda s: s["metadata"]["uid"] != before["metadata"]["uid"], "the slice published again"
        )
        assert time.monotonic() - started < WAIT
    finally:
        restarted.stop()
    assert _devices(again) == _devices(before)
    assert again["spec"]["pool"]["generation"] == 1  # no slice of the pool was left to count from
