"""Checked-in stubs must be exactly what proto/ generates, and the wire names must be upstream's."""

from __future__ import annotations

import importlib
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
        pytest.skip(
            f"the drift check regenerates with grpcio-tools=={genproto.GRPC_TOOLS} (dev extra); {installed} here"
        )
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
    from pytest_devplug.api.dra import v1_pb2 as dra
    from pytest_devplug.api.drahealth import v1alpha1_pb2 as health
    from pytest_devplug.api.pluginregistration import v1_pb2 as reg

    for symbol in (
        "v1beta1.DevicePluginOptions",
        "v1beta1.AllocateResponse",
        "v1.ListPodResourcesResponse",
        "pluginregistration.PluginInfo",
        "k8s.io.kubelet.pkg.apis.dra.v1.NodePrepareResourcesRequest",
        "v1alpha1.DeviceHealth",
    ):
        with pytest.raises(KeyError):
            default.FindMessageTypeByName(symbol)
    with pytest.raises(KeyError):
        default.FindFileByName("deviceplugin/v1beta1.proto")
    assert all(m.DESCRIPTOR.pool is _pool.POOL for m in (dp, pr, reg, dra, health))
    assert plugin_dp.DESCRIPTOR.pool is plugin_pool.POOL is not _pool.POOL
    from devplug_gpu_plugin.api.dra import v1_pb2 as plugin_dra
    from devplug_gpu_plugin.api.drahealth import v1alpha1_pb2 as plugin_health
    from devplug_gpu_plugin.api.pluginregistration import v1_pb2 as plugin_reg

    assert all(m.DESCRIPTOR.pool is plugin_pool.POOL for m in (plugin_dra, plugin_health, plugin_reg))
    # Same wire format across the two pools: the plugin's bytes are the harness's message.
    sent = plugin_dp.AllocateResponse(container_responses=[{"envs": {"A": "1"}, "cdi_devices": [{"name": "v/g=0"}]}])
    got = dp.AllocateResponse.FromString(sent.SerializeToString())
    assert got.container_responses[0].envs["A"] == "1" and got.container_responses[0].cdi_devices[0].name == "v/g=0"
    assert plugin_dp.AllocateResponse.DESCRIPTOR.full_name == dp.AllocateResponse.DESCRIPTOR.full_name


def test_stub_classes_name_their_module() -> None:
    assert repr(dp.ContainerAllocateResponse.EnvsEntry) == (
        "<class 'pytest_devplug.api.deviceplugin.v1beta1_pb2.ContainerAllocateResponse.EnvsEntry'>"
    )


def test_plugin_registration_wire_names_and_numbers() -> None:
    from pytest_devplug.api.pluginregistration import v1_pb2 as reg

    assert reg.DESCRIPTOR.package == "pluginregistration"
    assert _fields(reg.PluginInfo) == {"type": 1, "name": 2, "endpoint": 3, "supported_versions": 4}
    assert _fields(reg.RegistrationStatus) == {"plugin_registered": 1, "error": 2}
    assert _fields(reg.InfoRequest) == {} and _fields(reg.RegistrationStatusResponse) == {}
    methods = {m.full_name for s in reg.DESCRIPTOR.services_by_name.values() for m in s.methods}
    assert methods == {
        "pluginregistration.Registration.GetInfo",
        "pluginregistration.Registration.NotifyRegistrationStatus",
    }


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_dra_plugin_wire_names_and_numbers(version: str) -> None:
    dra = importlib.import_module(f"pytest_devplug.api.dra.{version}_pb2")
    package = f"k8s.io.kubelet.pkg.apis.dra.{version}"
    assert dra.DESCRIPTOR.package == package
    device = {"request_names": 1, "pool_name": 2, "device_name": 3, "cdi_device_ids": 4}
    if version == "v1":
        device["share_id"] = 5  # Kubernetes 1.35+, proto3 optional
        assert dra.Device.DESCRIPTOR.fields_by_name["share_id"].has_presence
    assert _fields(dra.Device) == device
    assert _fields(dra.Claim) == {"namespace": 1, "uid": 2, "name": 3}
    assert _fields(dra.NodePrepareResourcesRequest) == {"claims": 1}
    assert _fields(dra.NodePrepareResourcesResponse) == {"claims": 1}
    assert _fields(dra.NodePrepareResourceResponse) == {"devices": 1, "error": 2}
    assert _fields(dra.NodeUnprepareResourcesRequest) == {"claims": 1}
    assert _fields(dra.NodeUnprepareResourceResponse) == {"error": 1}
    assert dra.NodePrepareResourcesResponse.DESCRIPTOR.fields_by_name["claims"].message_type.GetOptions().map_entry
    methods = [m.full_name for m in dra.DESCRIPTOR.services_by_name["DRAPlugin"].methods]
    assert methods == [f"{package}.DRAPlugin.NodePrepareResources", f"{package}.DRAPlugin.NodeUnprepareResources"]


def test_dra_health_wire_names_and_numbers() -> None:
    from pytest_devplug.api.drahealth import v1alpha1_pb2 as health

    assert health.DESCRIPTOR.package == "v1alpha1"
    assert {v.name: v.number for v in health.HealthStatus.DESCRIPTOR.values} == {
        "UNKNOWN": 0,
        "HEALTHY": 1,
        "UNHEALTHY": 2,
    }
    assert (health.UNKNOWN, health.HEALTHY, health.UNHEALTHY) == (0, 1, 2)
    assert health.HealthStatus.Name(health.UNHEALTHY) == "UNHEALTHY"
    assert _fields(health.DeviceIdentifier) == {"pool_name": 1, "device_name": 2}
    assert _fields(health.DeviceHealth) == {
        "device": 1,
        "health": 2,
        "last_updated_time": 3,
        "health_check_timeout_seconds": 4,
        "message": 5,
    }
    assert _fields(health.NodeWatchResourcesResponse) == {"devices": 1}
    (method,) = health.DESCRIPTOR.services_by_name["DRAResourceHealth"].methods
    assert method.full_name == "v1alpha1.DRAResourceHealth.NodeWatchResources"
    assert method.server_streaming and not method.client_streaming


def test_checked_in_feature_gates_match_upstreams_tables() -> None:
    """``kubeletmodel/featuregates_generated.py`` is what upstream's kube_features.go of each pinned release says
    (the generator downloads those modules through the Go module proxy)."""
    run = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "genfeaturegates.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, (
        f"feature gates drifted (run `python tools/genfeaturegates.py`):\n{run.stdout}{run.stderr}"
    )


def test_the_v1_health_api_is_v1alpha1_field_for_field() -> None:
    """``v1.DRAResourceHealth`` (1.37) and ``v1alpha1`` carry the same messages: one stream loop reads both."""
    from pytest_devplug.api.drahealth import v1_pb2, v1alpha1_pb2

    for name in ("DeviceIdentifier", "DeviceHealth", "NodeWatchResourcesRequest", "NodeWatchResourcesResponse"):
        a, b = getattr(v1_pb2, name).DESCRIPTOR, getattr(v1alpha1_pb2, name).DESCRIPTOR
        assert [(f.name, f.number, f.type) for f in a.fields] == [(f.name, f.number, f.type) for f in b.fields], name
    assert v1_pb2.DESCRIPTOR.services_by_name["DRAResourceHealth"].full_name == "v1.DRAResourceHealth"
