"""Checked-in stubs must be exactly what proto/ generates, and the wire names must be upstream's."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_devplug.api.deviceplugin import v1beta1_pb2 as dp
from pytest_devplug.api.podresources import v1_pb2 as pr

ROOT = Path(__file__).resolve().parent.parent


def test_checked_in_stubs_match_the_protos() -> None:
    spec = importlib.util.spec_from_file_location("genproto", ROOT / "tools" / "genproto.py")
    assert spec is not None and spec.loader is not None
    genproto = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(genproto)
    if (installed := genproto.installed_grpc_tools()) != genproto.GRPC_TOOLS:
        pytest.skip(f"the drift check regenerates with grpcio-tools=={genproto.GRPC_TOOLS} (dev extra); {installed} here")
    run = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "genproto.py"), "--check"], capture_output=True, text=True
    )
    assert run.returncode == 0, f"stubs drifted from proto/ (run `nox -s proto`):\n{run.stdout}{run.stderr}"


def _fields(message: type) -> dict[str, int]:
    return {f.name: f.number for f in message.DESCRIPTOR.fields}  # type: ignore[attr-defined]


def test_device_plugin_wire_names_and_numbers() -> None:
    assert dp.DESCRIPTOR.package == "v1beta1"
    assert _fields(dp.RegisterRequest) == {"version": 1, "endpoint": 2, "resource_name": 3, "options": 4}
    assert _fields(dp.DevicePluginOptions) == {"pre_start_required": 1, "get_preferred_allocation_available": 2}
    assert _fields(dp.Device) == {"ID": 1, "health": 2, "topology": 3}
    assert _fields(dp.NUMANode) == {"ID": 1}
    assert _fields(dp.ContainerPreferredAllocationRequest) == {
        "available_deviceIDs": 1,
        "must_include_deviceIDs": 2,
        "allocation_size": 3,
    }
    assert _fields(dp.ContainerPreferredAllocationResponse) == {"deviceIDs": 1}
    assert _fields(dp.ContainerAllocateRequest) == {"devices_ids": 1}
    assert _fields(dp.PreStartContainerRequest) == {"devices_ids": 1}
    assert _fields(dp.ContainerAllocateResponse) == {
        "envs": 1,
        "mounts": 2,
        "devices": 3,
        "annotations": 4,
        "cdi_devices": 5,
    }
    assert _fields(dp.Mount) == {"container_path": 1, "host_path": 2, "read_only": 3}
    assert _fields(dp.DeviceSpec) == {"container_path": 1, "host_path": 2, "permissions": 3}
    methods = {m.full_name for s in dp.DESCRIPTOR.services_by_name.values() for m in s.methods}
    assert methods == {
        "v1beta1.Registration.Register",
        "v1beta1.DevicePlugin.GetDevicePluginOptions",
        "v1beta1.DevicePlugin.ListAndWatch",
        "v1beta1.DevicePlugin.GetPreferredAllocation",
        "v1beta1.DevicePlugin.Allocate",
        "v1beta1.DevicePlugin.PreStartContainer",
    }


def test_pod_resources_wire_names_and_numbers() -> None:
    assert pr.DESCRIPTOR.package == "v1"
    assert _fields(pr.ContainerResources) == {
        "name": 1,
        "devices": 2,
        "cpu_ids": 3,
        "memory": 4,
        "dynamic_resources": 5,
    }
    assert _fields(pr.ContainerDevices) == {"resource_name": 1, "device_ids": 2, "topology": 3}
    assert _fields(pr.AllocatableResourcesResponse) == {"devices": 1, "cpu_ids": 2, "memory": 3}
    assert _fields(pr.GetPodResourcesRequest) == {"pod_name": 1, "pod_namespace": 2}
    assert [m.name for m in pr.DESCRIPTOR.services_by_name["PodResourcesLister"].methods] == [
        "List",
        "GetAllocatableResources",
        "Get",
    ]


def test_stubs_stay_out_of_protobufs_default_pool() -> None:
    """Each distribution has its own private pool; protobuf's default pool (where a user's stubs generated
    from upstream's api.proto go) holds none of our symbols, so the two never clash."""
    from google.protobuf import descriptor_pool

    from devplug_gpu_plugin.api import _pool as plugin_pool
    from devplug_gpu_plugin.api.deviceplugin import v1beta1_pb2 as plugin_dp
    from pytest_devplug.api import _pool

    default = descriptor_pool.Default()
    for symbol in ("v1beta1.DevicePluginOptions", "v1beta1.AllocateResponse", "v1.ListPodResourcesResponse"):
        with pytest.raises(KeyError):
            default.FindMessageTypeByName(symbol)
    with pytest.raises(KeyError):
        default.FindFileByName("deviceplugin/v1beta1.proto")
    assert dp.DESCRIPTOR.pool is _pool.POOL and pr.DESCRIPTOR.pool is _pool.POOL
    assert plugin_dp.DESCRIPTOR.pool is plugin_pool.POOL is not _pool.POOL
    # Same wire format across the two pools: the plugin's bytes are the harness's message.
    sent = plugin_dp.AllocateResponse(container_responses=[{"envs": {"A": "1"}, "cdi_devices": [{"name": "v/g=0"}]}])
    got = dp.AllocateResponse.FromString(sent.SerializeToString())
    assert got.container_responses[0].envs["A"] == "1" and got.container_responses[0].cdi_devices[0].name == "v/g=0"
    assert plugin_dp.AllocateResponse.DESCRIPTOR.full_name == dp.AllocateResponse.DESCRIPTOR.full_name


def test_stub_classes_name_their_module() -> None:
    assert repr(dp.ContainerAllocateResponse.EnvsEntry) == (
        "<class 'pytest_devplug.api.deviceplugin.v1beta1_pb2.ContainerAllocateResponse.EnvsEntry'>"
    )
