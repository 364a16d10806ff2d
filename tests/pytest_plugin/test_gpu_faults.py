"""GPU faults judged per backing GPU: device IDs mapped to the mock GPU behind them, a fault reaching every
device it backs, and a check that names the device a fault left Healthy (NVIDIA's bug #1929 shape).

The included plugin with two replicas per GPU (``DP_REPLICAS=2``: ``<uuid>::0``, ``<uuid>::1``) marks both
replicas of a GPU with a critical Xid Unhealthy: the check passes. NVIDIA's plugin v0.19.1 with time-slicing
marks one and fails it (``tests/peers/test_nvidia_plugin.py``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from pytest_devplug import ClusterHandle, NodeSpec, PluginHandle, PluginSpec, assert_devices_unhealthy
from pytest_devplug.backends.base import BackendOptions, ContainerView, DeviceNodeView
from pytest_devplug.errors import FaultNotSupportedError, UnknownBackingError, UnsupportedOperationError
from pytest_devplug.backends.mockstate import initial_state, mig_uuid
from pytest_devplug.backends.sim import SimBackend
from pytest_devplug.backing import backed_devices, backing_gpu, injected_gpus
from pytest_devplug.faults import MockNvmlFaults, NvmlXidFaults, fault_domain
from pytest_devplug.settings import default_plugin_argv

GPUS = initial_state(2, 1)["gpus"]
A, B = (str(g["uuid"]) for g in GPUS)


@pytest.mark.parametrize(
    ("device_id", "gpu"),
    [(A, A), (f"{A}::0", A), (f"{B}::1", B), ("nvidia1", B), ("/dev/nvidia0", A), (f"k8s.nvidia.com/gpu={B}", B)],
)
def test_device_ids_map_to_their_backing_gpu(device_id: str, gpu: str) -> None:
    assert backing_gpu(device_id, GPUS) == gpu


@pytest.mark.parametrize("device_id", ["0", "card0-0", "nvidia7"])
def test_an_id_naming_no_gpu_says_so(device_id: str) -> None:
    with pytest.raises(UnknownBackingError, match=re.escape(f"device ID {device_id!r} names no mock GPU")):
        backing_gpu(device_id, GPUS)


def test_an_id_naming_two_gpus_says_so() -> None:
    with pytest.raises(UnknownBackingError, match=re.escape(f"device ID '{A}+{B}' names 2 mock GPUs")):
        backing_gpu(f"{A}+{B}", GPUS)


MIG_GPUS = initial_state(2, 1, ["1g.5gb", "2g.10gb"])["gpus"]
MIG_A0, MIG_B1 = mig_uuid(0, 0), mig_uuid(1, 1)


def test_a_mig_device_is_backed_by_its_gpu() -> None:
    assert backing_gpu(MIG_B1, MIG_GPUS) == B
    assert backed_devices([MIG_A0, MIG_B1, f"{mig_uuid(0, 1)}::0"], MIG_GPUS) == {
        A: sorted([MIG_A0, f"{mig_uuid(0, 1)}::0"]),
        B: [MIG_B1],
    }


def view(envs: dict[str, str] | None = None, devices: tuple[str, ...] = (), cdi: tuple[str, ...] = ()) -> ContainerView:
    return ContainerView(
        envs=envs or {},
        mounts=(),
        devices=tuple(DeviceNodeView(d, d, "rw") for d in devices),
        annotations={},
        cdi_devices=cdi,
    )


@pytest.mark.parametrize(
    ("injected", "gpus"),
    [
        (view({"NVIDIA_VISIBLE_DEVICES": B}), [B]),
        (view({"NVIDIA_VISIBLE_DEVICES": "1"}), [B]),  # the NVML index, as NVIDIA's runtime reads it
        (view({"NVIDIA_VISIBLE_DEVICES": "0:1"}), [A]),  # MIG device 1 of GPU 0
        (view({"NVIDIA_VISIBLE_DEVICES": MIG_B1}), [B]),
        (view(devices=("/dev/nvidiactl", "/dev/nvidia1")), [B]),
        (view(cdi=(f"k8s.nvidia.com/gpu={A}",)), [A]),
        (view({"NVIDIA_VISIBLE_DEVICES": "0,1"}), [A, B]),
        (view({"WIDGET_IDS": "widget-0"}, devices=("/dev/widget-0",)), []),
    ],
)
def test_what_allocate_injects_tells_which_gpus_a_device_reaches(injected: ContainerView, gpus: list[str]) -> None:
    assert injected_gpus(injected, MIG_GPUS) == gpus


def test_opaque_ids_are_mapped_by_what_allocate_injects_for_each() -> None:
    asked: list[list[str]] = []

    def injections(ids: list[str]) -> dict[str, ContainerView]:
        asked.append(ids)
        return {"card-a": view(devices=("/dev/nvidia0",)), "card-b": view({"NVIDIA_VISIBLE_DEVICES": B})}

    assert backed_devices(["card-b", A, "card-a"], GPUS, injections) == {A: sorted([A, "card-a"]), B: ["card-b"]}
    assert asked == [["card-b", "card-a"]]  # once, for the IDs that name no GPU
    assert backing_gpu("card-b", GPUS, injections) == B


def test_opaque_ids_that_nothing_maps_keep_their_reason() -> None:
    def widgets(ids: list[str]) -> dict[str, ContainerView]:
        return {i: view({"WIDGET_IDS": i}, devices=(f"/dev/{i}",)) for i in ids}

    with pytest.raises(
        UnknownBackingError,
        match=r"Allocate for it alone injects env \{'WIDGET_IDS': 'widget-0'\}; "
        r"devices \['/dev/widget-0'\], which reaches 0 mock GPUs",
    ):
        backed_devices(["widget-0"], GPUS, widgets)

    def unsupported(ids: list[str]) -> dict[str, ContainerView]:
        raise UnsupportedOperationError("kind: not implemented")

    with pytest.raises(UnknownBackingError, match="what Allocate injects for it is unknown: kind: not implemented"):
        backing_gpu("0", GPUS, unsupported)


def test_backed_devices_lists_every_gpu() -> None:
    assert backed_devices([f"{A}::1", f"{A}::0"], GPUS) == {A: [f"{A}::0", f"{A}::1"], B: []}


@pytest.fixture(scope="module")
def replicas() -> Iterator[PluginHandle]:
    """The included plugin on two mock GPUs, each listed as two replicas."""
    backend = SimBackend(BackendOptions(timeout=20.0))
    backend.start()
    try:
        node = ClusterHandle(backend, timeout=20.0).ensure_node(NodeSpec("devplug-replicas", numa_nodes=1))
        spec = PluginSpec(
            argv=default_plugin_argv("nvidia.com/gpu"), mock=True, gpus=2, numa_nodes=1, env={"DP_REPLICAS": "2"}
        )
        plugin = ClusterHandle(backend, timeout=20.0).deploy(node, spec)
        plugin.wait_listed()
        yield plugin
    finally:
        backend.close()


def test_injectors_speak_device_ids_and_know_the_fault_domain(replicas: PluginHandle) -> None:
    faults = NvmlXidFaults(replicas)
    assert faults.device_ids == sorted(f"{u}::{n}" for u in (A, B) for n in (0, 1))
    assert fault_domain(faults, f"{B}::1") == [f"{B}::0", f"{B}::1"]
    assert fault_domain(object(), "x") == ["x"]  # type: ignore[arg-type]  # an injector that does not know
    with pytest.raises(FaultNotSupportedError, match="'card0' names no mock GPU"):
        MockNvmlFaults(replicas).set_unhealthy("card0")
    with pytest.raises(FaultNotSupportedError, match="nvml-xid"):
        NvmlXidFaults(replicas, xid_health=False).set_unhealthy(f"{A}::0")


def test_a_gpu_fault_must_reach_every_replica(replicas: PluginHandle) -> None:
    """Xid 79 on GPU A: both its replicas go Unhealthy (pass); a check that also expects one of B's names it."""
    n = replicas.node.capacity(replicas.resource_name)
    NvmlXidFaults(replicas).set_unhealthy(f"{A}::1")
    assert_devices_unhealthy(replicas, [f"{A}::0", f"{A}::1"], kept=[f"{B}::0", f"{B}::1"], capacity=n, cause="Xid 79")
    with pytest.raises(AssertionError, match=rf"still Healthy \(allocatable\): \['{B}::0'\]"):
        assert_devices_unhealthy(replicas, [f"{A}::0", f"{A}::1", f"{B}::0"], capacity=n, cause="Xid 79", timeout=0.5)
