"""The NVLink fabric on the mock NVML (``nvmlDeviceGetGpuFabricInfo``, ``...V``), as NVIDIA's DRA driver reads it.

Its ComputeDomain kubelet plugin takes the node's clique ID from every GPU's fabric info and refuses to start when
the probe is not complete or the GPUs disagree; a GPU without a fabric must answer NOT_SUPPORTED, which it reads as
"no clique". The mock's Hopper and newer models are HGX boards whose GPUs Fabric Manager registered in one cluster
and clique; the A100s have no fabric (NVML: "for Hopper or newer fully supported devices").
"""

from __future__ import annotations

import ctypes
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_devplug.backends import mockstate
from pytest_devplug.nvml.probe import Handle, Nvml
from pytest_devplug.errors import NvmlError
from pytest_devplug.waiting import wait_for

from .nvml_helpers import StateFile
from .test_mig import mig_devices

INVALID_ARGUMENT, NOT_SUPPORTED, GPU_IS_LOST, ARGUMENT_VERSION_MISMATCH = 2, 3, 15, 25
STATE_COMPLETED, HEALTH_SUMMARY_HEALTHY = 3, 1
#: Every health mask field at its good value: degraded bandwidth, route recovery, route unhealthy, access timeout
#: recovery FALSE (2, at bits 0, 2, 4, 6), incorrect configuration NONE (1, at bit 8).
HEALTH_MASK_GOOD = 2 | 2 << 2 | 2 << 4 | 2 << 6 | 1 << 8
CLUSTER = uuid.UUID("f2a3b4c5-d6e7-4f80-9a1b-2c3d4e5f6a7b")
CLIQUE = 1
FABRIC = {"a100-40gb": False, "a100-80gb": False, "h100-80gb": True, "h200-141gb": True, "b200": True}


class FabricInfo(ctypes.Structure):
    _fields_ = [
        ("cluster_uuid", ctypes.c_ubyte * 16),
        ("status", ctypes.c_int),
        ("clique_id", ctypes.c_uint),
        ("state", ctypes.c_ubyte),
    ]


class FabricInfoV2(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("cluster_uuid", ctypes.c_ubyte * 16),
        ("status", ctypes.c_int),
        ("clique_id", ctypes.c_uint),
        ("state", ctypes.c_ubyte),
        ("health_mask", ctypes.c_uint),
    ]


class FabricInfoV3(ctypes.Structure):
    _fields_ = [*FabricInfoV2._fields_, ("health_summary", ctypes.c_ubyte)]


V2 = ctypes.sizeof(FabricInfoV2) | 2 << 24
V3 = ctypes.sizeof(FabricInfoV3) | 3 << 24


def _code(nvml: Nvml, name: str, *args: object) -> int:
    with pytest.raises(NvmlError) as info:
        nvml.call(name, *args)
    return info.value.code


def _fabric_code(nvml: Nvml, gpu: Handle) -> int:
    """What the fabric call answers: 0 or the NVML error."""
    try:
        nvml.call("nvmlDeviceGetGpuFabricInfo", gpu, ctypes.byref(FabricInfo()))
    except NvmlError as exc:
        return exc.code
    return 0


def _fabric(nvml: Nvml, gpu: Handle) -> tuple[uuid.UUID, int, int, int]:
    info = FabricInfo()
    nvml.call("nvmlDeviceGetGpuFabricInfo", gpu, ctypes.byref(info))
    return uuid.UUID(bytes=bytes(info.cluster_uuid)), info.status, info.clique_id, info.state


def test_every_model_is_covered() -> None:
    assert set(FABRIC) == set(mockstate.GPU_MODELS)


@pytest.mark.parametrize("model", sorted(FABRIC))
def test_a_model_has_a_fabric_as_that_board_has(model: str, mock_lib_path: Path, state: StateFile) -> None:
    state.write(mockstate.initial_state(4, 2, model=model))
    nvml = Nvml(str(mock_lib_path))
    nvml.init()
    try:
        for gpu in nvml.handles():
            if FABRIC[model]:  # registered (probe complete, no error) in the node's one cluster and clique
                assert _fabric(nvml, gpu) == (CLUSTER, 0, CLIQUE, STATE_COMPLETED)
            else:
                assert _code(nvml, "nvmlDeviceGetGpuFabricInfo", gpu, ctypes.byref(FabricInfo())) == NOT_SUPPORTED
                assert (
                    _code(nvml, "nvmlDeviceGetGpuFabricInfoV", gpu, ctypes.byref(FabricInfoV3(version=V3)))
                    == NOT_SUPPORTED
                )
    finally:
        while int(nvml.lib.nvmlShutdown()) == 0:
            pass


@pytest.fixture
def hopper(mock_lib_path: Path, state: StateFile) -> Iterator[Nvml]:
    """Two H100s, the second MIG-enabled; shut down fully afterwards."""
    doc = mockstate.initial_state(2, 1, ["1g.10gb"], model="h100-80gb")
    doc["gpus"][0].update(mig_enabled=False, mig_devices=[])
    state.write(doc)
    nvml = Nvml(str(mock_lib_path))
    nvml.init()
    yield nvml
    while int(nvml.lib.nvmlShutdown()) == 0:
        pass


def test_versioned_call_answers_the_version_asked(hopper: Nvml) -> None:
    """v3 gets the health mask and summary; a v2 struct (4 bytes shorter) keeps its bytes beyond v2 untouched."""
    gpu = hopper.handles()[0]
    v3 = FabricInfoV3(version=V3)
    hopper.call("nvmlDeviceGetGpuFabricInfoV", gpu, ctypes.byref(v3))
    got = (
        v3.version,
        uuid.UUID(bytes=bytes(v3.cluster_uuid)),
        v3.status,
        v3.clique_id,
        v3.state,
        v3.health_mask,
        v3.health_summary,
    )
    assert got == (V3, CLUSTER, 0, CLIQUE, STATE_COMPLETED, HEALTH_MASK_GOOD, HEALTH_SUMMARY_HEALTHY)
    buf = (ctypes.c_ubyte * ctypes.sizeof(FabricInfoV3))(*[0xAB] * ctypes.sizeof(FabricInfoV3))
    v2 = FabricInfoV2.from_buffer(buf)
    v2.version = V2
    hopper.call("nvmlDeviceGetGpuFabricInfoV", gpu, ctypes.byref(v2))
    assert (v2.version, v2.state, v2.health_mask) == (V2, STATE_COMPLETED, HEALTH_MASK_GOOD)
    assert bytes(buf[ctypes.sizeof(FabricInfoV2) :]) == b"\xab" * (
        ctypes.sizeof(FabricInfoV3) - ctypes.sizeof(FabricInfoV2)
    )


@pytest.mark.parametrize("version", [0, ctypes.sizeof(FabricInfo) | 1 << 24, ctypes.sizeof(FabricInfoV3) | 4 << 24])
def test_versioned_call_refuses_other_versions(hopper: Nvml, version: int) -> None:
    info = FabricInfoV3(version=version)
    assert (
        _code(hopper, "nvmlDeviceGetGpuFabricInfoV", hopper.handles()[0], ctypes.byref(info))
        == ARGUMENT_VERSION_MISMATCH
    )


def test_a_mig_device_no_argument_and_a_lost_gpu(hopper: Nvml, state: StateFile) -> None:
    """A MIG device has no fabric of its own (its GPU has); no struct is INVALID_ARGUMENT; a lost GPU is lost."""
    gpu, mig_gpu = hopper.handles()
    (mig,) = mig_devices(hopper, mig_gpu)
    assert _fabric(hopper, mig_gpu)[3] == STATE_COMPLETED
    assert _code(hopper, "nvmlDeviceGetGpuFabricInfo", mig, ctypes.byref(FabricInfo())) == NOT_SUPPORTED
    assert _code(hopper, "nvmlDeviceGetGpuFabricInfo", gpu, None) == INVALID_ARGUMENT
    assert _code(hopper, "nvmlDeviceGetGpuFabricInfoV", gpu, None) == INVALID_ARGUMENT
    state.write(mockstate.with_lost(mockstate.initial_state(2, 1, model="h100-80gb"), mockstate.gpu_uuid(0), True))
    wait_for(
        lambda: _fabric_code(hopper, gpu), lambda rc: rc == GPU_IS_LOST, timeout=10, what="the lost GPU's fabric call"
    )
