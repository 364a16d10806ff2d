"""GPU models on the mock libnvidia-ml.so.1 (``"model"`` in the state, ``--devplug-gpu-model``): each answers NVML as
that GPU does — name, memory, PCI device ID, architecture, compute capability, SMs — and names its MIG profiles as
NVIDIA documents them for that GPU (go-nvlib derives the names from the profile's memory)."""

from __future__ import annotations

import ctypes
import math

import pytest

from pytest_devplug.backends import mockstate
from pytest_devplug.nvml.probe import Nvml
from pytest_devplug.errors import NvmlError
from pytest_devplug.sim.gpunode import gpu_pci_functions

from .nvml_helpers import StateFile
from .test_mig import GiProfileInfo, mig_devices

#: model -> (name, memory MiB, PCI device ID, architecture, compute capability, SMs)
FACTS = {
    "a100-40gb": ("NVIDIA A100-SXM4-40GB", 40960, 0x20B010DE, 7, (8, 0), 108),
    "a100-80gb": ("NVIDIA A100-SXM4-80GB", 81920, 0x20B210DE, 7, (8, 0), 108),
    "h100-80gb": ("NVIDIA H100 80GB HBM3", 81559, 0x233010DE, 9, (9, 0), 132),
    "h200-141gb": ("NVIDIA H200", 143771, 0x233510DE, 9, (9, 0), 132),
    "b200": ("NVIDIA B200", 183359, 0x290110DE, 10, (10, 0), 148),
}
#: NVIDIA's MIG user guide: each GPU's profiles by GPU instance profile ID (0 1g, 7 1g+me, 9 1g with 2 memory slices,
#: 1 2g, 2 3g, 3 4g, 4 7g).
MIG_NAMES = {
    "a100-40gb": ["1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"],
    "a100-80gb": ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    "h100-80gb": ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    "h200-141gb": ["1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"],
    "b200": ["1g.23gb", "1g.23gb+me", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"],
}
GI_PROFILE_ORDER = (0, 7, 9, 1, 2, 3, 4)


class PciInfo(ctypes.Structure):
    _fields_ = [
        ("bus_id_legacy", ctypes.c_char * 16),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pci_device_id", ctypes.c_uint),
        ("pci_subsystem_id", ctypes.c_uint),
        ("bus_id", ctypes.c_char * 32),
    ]


class Attributes(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint) for n in ("sm", "copy", "dec", "enc", "jpeg", "ofa", "gi_slices", "ci_slices")] + [
        ("memory_mb", ctypes.c_ulonglong)
    ]


def test_every_model_is_tested() -> None:
    assert set(FACTS) == set(MIG_NAMES) == set(mockstate.GPU_MODELS)


@pytest.mark.parametrize("model", sorted(FACTS))
def test_a_model_answers_as_that_gpu(model: str, mock_lib_path: object, state: StateFile) -> None:
    name, memory, pci_id, arch, cc, sms = FACTS[model]
    doc = mockstate.initial_state(2, 1, [MIG_NAMES[model][0]], model=model)
    doc["gpus"][1].update(mig_enabled=False, mig_devices=[])
    state.write(doc)
    nvml = Nvml(str(mock_lib_path))
    nvml.init()
    try:
        gpu = nvml.handles()[1]
        assert nvml.text("nvmlDeviceGetName", gpu) == name
        assert nvml.memory_total(gpu) == memory << 20
        pci = PciInfo()
        nvml.call("nvmlDeviceGetPciInfo_v3", gpu, ctypes.byref(pci))
        assert pci.pci_device_id == pci_id
        # the mock GPU node shows the same PCI function in sysfs, where NVIDIA's plugins look it up by the bus ID
        sysfs = gpu_pci_functions(doc["gpus"])[1]
        bus_id = pci.bus_id.decode().lower().removeprefix("0000")
        assert (sysfs.address, int(sysfs.device, 16)) == (bus_id, pci_id >> 16)
        got_arch, major, minor = ctypes.c_uint(), ctypes.c_int(), ctypes.c_int()
        nvml.call("nvmlDeviceGetArchitecture", gpu, ctypes.byref(got_arch))
        nvml.call("nvmlDeviceGetCudaComputeCapability", gpu, ctypes.byref(major), ctypes.byref(minor))
        assert (got_arch.value, (major.value, minor.value)) == (arch, cc)
        attrs = Attributes()
        nvml.call("nvmlDeviceGetAttributes_v2", gpu, ctypes.byref(attrs))
        assert attrs.sm == sms
        seen = []
        for profile in GI_PROFILE_ORDER:  # go-nvlib's name: the memory fraction rounded up to eighths of the GPU's GiB
            info = GiProfileInfo()
            nvml.call("nvmlDeviceGetGpuInstanceProfileInfo", gpu, ctypes.c_uint(profile), ctypes.byref(info))
            gib = math.ceil(memory / 1024)
            gb = math.floor(math.ceil(info.memory_mb / memory * 8) / 8 * gib + 0.5)  # Go rounds half away from 0
            seen.append(f"{info.slices}g.{gb}gb" + ("+me" if profile == 7 else ""))
        assert seen == MIG_NAMES[model]
        (mig,) = mig_devices(nvml, nvml.handles()[0])
        assert nvml.text("nvmlDeviceGetName", mig) == f"{name} MIG {MIG_NAMES[model][0]}"
    finally:
        nvml.shutdown()


def test_mockstate_names_each_models_mig_profiles_as_nvidia_does() -> None:
    for model, names in MIG_NAMES.items():
        assert list(mockstate.mig_profiles(model)) == names, model
    mockstate.check_mig_profiles(["1g.10gb", "3g.40gb"], "h100-80gb")
    with pytest.raises(
        ValueError, match=r"unknown MIG profile\(s\) \['1g.5gb'\]; the mock GPUs \(h100-80gb\) have 1g.10gb"
    ):
        mockstate.check_mig_profiles(["1g.5gb"], "h100-80gb")
    with pytest.raises(ValueError, match="unknown GPU model 'v100'"):
        mockstate.initial_state(1, 1, model="v100")


def test_an_unknown_model_in_the_state_is_refused_naming_it(
    mock_lib_path: object, state: StateFile, capfd: pytest.CaptureFixture[str]
) -> None:
    doc = mockstate.initial_state(1, 1)
    doc["gpus"][0]["model"] = "v100"
    state.write(doc)
    nvml = Nvml(str(mock_lib_path))
    with pytest.raises(NvmlError):
        nvml.init()
    err = capfd.readouterr().err
    assert (
        'gpus[0].model: unknown GPU model "v100" (known: a100-40gb, a100-80gb, h100-80gb, h200-141gb, b200)' in err
    ), err
