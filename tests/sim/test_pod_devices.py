"""PodDevices: the device manager's record of allocations, to and from the checkpoint, merged for the runtime."""

from __future__ import annotations

import logging

import pytest

from pytest_devplug.api.deviceplugin import v1beta1_pb2 as pb
from pytest_devplug.kubeletmodel.checkpoint import PodDevicesEntry
from pytest_devplug.sim.pod_devices import NO_NUMA, PodDevices

GPU, NIC = "example.com/gpu", "example.com/nic"


def _resp(**envs: str) -> pb.ContainerAllocateResponse:
    return pb.ContainerAllocateResponse(envs=envs)


def test_insert_and_the_views_of_it() -> None:
    pd = PodDevices()
    pd.insert("u1", "c", GPU, {0: ["g0"], 1: ["g2"]}, _resp(A="1"))
    pd.insert("u1", "c", NIC, {NO_NUMA: ["n0"]}, _resp(A="2", B="1"))
    pd.insert("u2", "c", GPU, {0: ["g1"]}, _resp())
    assert pd.pods() == {"u1", "u2"}
    assert pd.container_devices("u1", "c", GPU) == {"g0", "g2"} and pd.container_devices("u1", "x", GPU) is None
    assert pd.container_resources("u1", "c") == {GPU: {"g0", "g2"}, NIC: {"n0"}}
    assert pd.devices() == {GPU: {"g0", "g1", "g2"}, NIC: {"n0"}}
    assert pd.get_container_devices("u1", "c") == {GPU: {"g0": [0], "g2": [1]}, NIC: {"n0": []}}
    # merged by resource name: the first setting of A (example.com/gpu's) wins
    assert dict(pd.device_run_container_options("u1", "c").envs) == {"A": "1", "B": "1"}
    pd.delete(["u1", "gone"])
    assert pd.as_dict() == {"u2": {"c": {GPU: ["g1"]}}}


def test_checkpoint_round_trip_skips_an_undecodable_response(caplog: pytest.LogCaptureFixture) -> None:
    pd = PodDevices()
    pd.insert("u1", "c", GPU, {1: ["g2"], 0: ["g0"]}, _resp(A="1"))
    entries = pd.to_checkpoint_data()
    assert [(e.pod_uid, e.container_name, e.resource_name, e.device_ids) for e in entries] == [
        ("u1", "c", GPU, {0: ["g0"], 1: ["g2"]})
    ]
    bad = PodDevicesEntry("u2", "c", GPU, {0: ["g1"]}, b"\xff\xff")
    restored = PodDevices()
    with caplog.at_level(logging.ERROR):
        restored.from_checkpoint_data([*entries, bad], logging.getLogger("test-pod-devices"))
    assert restored.as_dict() == pd.as_dict() and "Can't unmarshal allocResp for u2 c" in caplog.text
    assert restored.to_checkpoint_data() == entries
