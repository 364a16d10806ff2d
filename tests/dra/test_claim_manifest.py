"""Claims as the harness writes them: a driver's opaque configuration reaches every request."""

from __future__ import annotations

from pytest_devplug.dra.objects import claim_manifest

GPU_CONFIG = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}}


def test_opaque_config_is_the_claims_device_config() -> None:
    body = claim_manifest("c", "ns", "gpu.example.com", count=2, config={"gpu.nvidia.com": GPU_CONFIG})
    devices = body["spec"]["devices"]
    assert devices["requests"] == [
        {"name": "req-0", "exactly": {"deviceClassName": "gpu.example.com", "allocationMode": "ExactCount", "count": 2}}
    ]
    # no "requests" in the entry: the API applies a config without them to every request of the claim
    assert devices["config"] == [{"opaque": {"driver": "gpu.nvidia.com", "parameters": GPU_CONFIG}}]


def test_no_config_no_config_entry() -> None:
    assert "config" not in claim_manifest("c", "ns", "gpu.example.com")["spec"]["devices"]
