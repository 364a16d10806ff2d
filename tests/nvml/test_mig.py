"""MIG on the mock libnvidia-ml.so.1: the calls NVIDIA's k8s-device-plugin v0.19.1 (go-nvlib v0.9.1) makes for
``--mig-strategy single`` and ``mixed``, through NVML's C ABI and struct layouts, and the profile names go-nvlib
derives from what they answer."""

from __future__ import annotations

import ctypes
import math
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_devplug.backends import mockstate
from pytest_devplug.nvml.probe import Handle, Nvml, format_report, probe
from pytest_devplug.errors import NvmlError

from .nvml_helpers import StateFile

INVALID_ARGUMENT, NOT_SUPPORTED, NOT_FOUND, DRIVER_NOT_LOADED, GPU_IS_LOST = 2, 3, 6, 9, 15
PROFILES = ["1g.5gb", "2g.10gb", "1g.5gb"]
GI_PROFILES = {0: "1g.5gb", 1: "2g.10gb", 2: "3g.20gb", 3: "4g.20gb", 4: "7g.40gb", 7: "1g.5gb+me", 9: "1g.10gb"}


class Attributes(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint) for n in ("sm", "copy", "dec", "enc", "jpeg", "ofa", "gi_slices", "ci_slices")] + [
        ("memory_mb", ctypes.c_ulonglong)
    ]


class GiProfileInfo(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_uint) for n in ("id", "p2p", "slices", "instances", "sm", "copy", "dec", "enc", "jpeg", "ofa")
    ] + [("memory_mb", ctypes.c_ulonglong)]


class GiInfo(ctypes.Structure):
    _fields_ = [
        ("device", ctypes.c_void_p),
        ("id", ctypes.c_uint),
        ("profile_id", ctypes.c_uint),
        ("start", ctypes.c_uint),
        ("size", ctypes.c_uint),
    ]


class CiProfileInfo(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint) for n in ("id", "slices", "instances", "sm", "copy", "dec", "enc", "jpeg", "ofa")]


class CiInfo(ctypes.Structure):
    _fields_ = [
        ("device", ctypes.c_void_p),
        ("gpu_instance", ctypes.c_void_p),
        ("id", ctypes.c_uint),
        ("profile_id", ctypes.c_uint),
        ("start", ctypes.c_uint),
        ("size", ctypes.c_uint),
    ]


def _code(fn: object, *args: object) -> int:
    with pytest.raises(NvmlError) as info:
        fn(*args)  # type: ignore[operator]
    return info.value.code


@pytest.fixture
def mig(mock_lib_path: Path, state: StateFile) -> Iterator[Nvml]:
    """GPU 0 MIG-enabled with PROFILES, GPU 1 MIG-capable but disabled, GPU 2 not MIG-capable."""
    doc = mockstate.initial_state(3, 1, PROFILES)
    doc["gpus"][1].update(mig_enabled=False, mig_devices=[])
    for key in ("mig_enabled", "mig_devices"):
        del doc["gpus"][2][key]
    state.write(doc)
    lib = Nvml(str(mock_lib_path))
    lib.init()
    yield lib
    lib.shutdown()


def handle_out(nvml: Nvml, name: str, *args: object) -> Handle:
    out = ctypes.c_void_p()
    nvml.call(name, *args, ctypes.byref(out))
    return Handle(out.value or 0)


def mig_devices(nvml: Nvml, gpu: Handle) -> list[Handle]:
    """go-nvlib's VisitMigDevices: every index up to the maximum, NOT_FOUND and INVALID_ARGUMENT skipped."""
    out = []
    for i in range(nvml.uint("nvmlDeviceGetMaxMigDeviceCount", gpu)):
        try:
            out.append(handle_out(nvml, "nvmlDeviceGetMigDeviceHandleByIndex", gpu, ctypes.c_uint(i)))
        except NvmlError as exc:
            assert exc.code in (NOT_FOUND, INVALID_ARGUMENT)
    return out


def mig_mode(nvml: Nvml, gpu: Handle) -> tuple[int, int]:
    current, pending = ctypes.c_uint(), ctypes.c_uint()
    nvml.call("nvmlDeviceGetMigMode", gpu, ctypes.byref(current), ctypes.byref(pending))
    return current.value, pending.value


def nvlib_profile(nvml: Nvml, m: Handle) -> str:
    """go-nvlib's MigDevice.GetProfile, step by step, down to the name it gives the profile."""
    parent = handle_out(nvml, "nvmlDeviceGetDeviceHandleFromMigDeviceHandle", m)
    total = nvml.memory_total(parent)
    attrs = Attributes()
    nvml.call("nvmlDeviceGetAttributes_v2", m, ctypes.byref(attrs))
    gi_id, ci_id = nvml.uint("nvmlDeviceGetGpuInstanceId", m), nvml.uint("nvmlDeviceGetComputeInstanceId", m)
    gi = handle_out(nvml, "nvmlDeviceGetGpuInstanceById", parent, ctypes.c_uint(gi_id))
    ci = handle_out(nvml, "nvmlGpuInstanceGetComputeInstanceById", gi, ctypes.c_uint(ci_id))
    gi_info, ci_info = GiInfo(), CiInfo()
    nvml.call("nvmlGpuInstanceGetInfo", gi, ctypes.byref(gi_info))
    nvml.call("nvmlComputeInstanceGetInfo_v2", ci, ctypes.byref(ci_info))
    assert gi_info.device == parent.value and ci_info.device == parent.value and ci_info.gpu_instance == gi.value
    for i in range(17):
        p = GiProfileInfo()
        try:
            nvml.call("nvmlDeviceGetGpuInstanceProfileInfo", parent, ctypes.c_uint(i), ctypes.byref(p))
        except NvmlError as exc:
            assert exc.code in (NOT_SUPPORTED, INVALID_ARGUMENT)
            continue
        if p.id != gi_info.profile_id:
            continue
        for j in range(8):
            c = CiProfileInfo()
            try:
                nvml.call(
                    "nvmlGpuInstanceGetComputeInstanceProfileInfo",
                    gi,
                    ctypes.c_uint(j),
                    ctypes.c_uint(0),
                    ctypes.byref(c),
                )
            except NvmlError as exc:
                assert exc.code in (NOT_SUPPORTED, INVALID_ARGUMENT)
                continue
            if c.id == ci_info.profile_id:
                fraction = math.ceil(attrs.memory_mb * 2**20 / total * 8) / 8
                gb = round(fraction * ((total + 2**30 - 1) // 2**30))
                suffix = "+me" if i == 7 else ""
                g = {0: 1, 7: 1, 9: 1, 1: 2, 2: 3, 3: 4, 4: 7}[i]
                return f"{g}g.{gb}gb{suffix}" if g == c.slices else f"{c.slices}c.{g}g.{gb}gb{suffix}"
    raise AssertionError("no matching profile IDs found")


def test_mig_mode_and_devices_as_the_state_says(mig: Nvml) -> None:
    gpus = mig.handles()
    assert len(gpus) == 3
    assert mig_mode(mig, gpus[0]) == (1, 1) and mig_mode(mig, gpus[1]) == (0, 0)
    assert _code(mig_mode, mig, gpus[2]) == NOT_SUPPORTED  # not MIG-capable: go-nvlib skips it
    assert len(mig_devices(mig, gpus[1])) == 0
    migs = mig_devices(mig, gpus[0])
    assert [mig.text("nvmlDeviceGetUUID", m) for m in migs] == [mockstate.mig_uuid(0, j) for j in range(3)]
    assert _code(handle_out, mig, "nvmlDeviceGetMigDeviceHandleByIndex", gpus[0], ctypes.c_uint(7)) == INVALID_ARGUMENT
    for j, m in enumerate(migs):
        assert mig.uint("nvmlDeviceIsMigDeviceHandle", m) == 1
        assert handle_out(mig, "nvmlDeviceGetDeviceHandleFromMigDeviceHandle", m) == gpus[0]
        assert mig.handle_by_uuid(mockstate.mig_uuid(0, j)) == m  # as drivers from R470 on answer
        assert (mig.uint("nvmlDeviceGetGpuInstanceId", m), mig.uint("nvmlDeviceGetComputeInstanceId", m)) == (j + 1, 0)
        assert mig.text("nvmlDeviceGetName", m) == f"NVIDIA A100-SXM4-40GB MIG {PROFILES[j]}"
        assert mig.uint("nvmlDeviceGetNumaNodeId", m) == mig.uint("nvmlDeviceGetNumaNodeId", gpus[0])
        assert mig.compute_capability(m) == "8.0"
        assert _code(mig.uint, "nvmlDeviceGetMinorNumber", m) == NOT_SUPPORTED  # NVIDIA's plugin asks the parent
    assert mig.uint("nvmlDeviceIsMigDeviceHandle", gpus[0]) == 0
    assert _code(handle_out, mig, "nvmlDeviceGetDeviceHandleFromMigDeviceHandle", gpus[0]) == INVALID_ARGUMENT
    assert _code(mig.uint, "nvmlDeviceGetGpuInstanceId", gpus[0]) == NOT_SUPPORTED
    assert [mig.memory_total(m) >> 20 for m in migs] == [5120, 10240, 5120]


def test_go_nvlib_names_each_mig_device_by_its_profile(mig: Nvml) -> None:
    assert [nvlib_profile(mig, m) for m in mig_devices(mig, mig.handles()[0])] == PROFILES


def test_the_profiles_nvidias_mixed_strategy_turns_into_resources(mig: Nvml) -> None:
    """VisitMigProfiles asks every GPU instance profile of a MIG-capable GPU: the A100's answer, others unsupported."""
    gpu = mig.handles()[1]  # MIG-capable, disabled: it still answers its profiles
    seen = {}
    for i in range(17):
        p = GiProfileInfo()
        try:
            mig.call("nvmlDeviceGetGpuInstanceProfileInfo", gpu, ctypes.c_uint(i), ctypes.byref(p))
        except NvmlError as exc:
            assert exc.code == NOT_SUPPORTED
            continue
        gb = round(math.ceil(p.memory_mb / 40960 * 8) / 8 * 40)
        seen[i] = f"{p.slices}g.{gb}gb" + ("+me" if i == 7 else "")
    assert seen == GI_PROFILES
    assert (
        _code(mig.call, "nvmlDeviceGetGpuInstanceProfileInfo", gpu, ctypes.c_uint(17), ctypes.byref(GiProfileInfo()))
        == INVALID_ARGUMENT
    )
    assert (
        _code(
            mig.call,
            "nvmlDeviceGetGpuInstanceProfileInfo",
            mig.handles()[2],
            ctypes.c_uint(0),
            ctypes.byref(GiProfileInfo()),
        )
        == NOT_SUPPORTED
    )


def test_probe_lists_the_mig_devices_of_each_mig_enabled_gpu(mig: Nvml, mock_lib_path: Path) -> None:
    """``devplug nvml probe``: each MIG device of a MIG-enabled GPU, by its UUID, name (with the profile) and
    instances; none for a GPU with MIG disabled or not supported."""
    report = probe(str(mock_lib_path))
    assert [d["MIG mode"] for d in report.devices] == ["enabled", "disabled", "n/a (Not Supported)"]
    assert report.devices[0]["MIG devices"] == str(len(PROFILES))
    assert "MIG devices" not in report.devices[1] and "MIG devices" not in report.devices[2]
    seen = [
        (m["gpu"], m["index"], m["uuid"], m["name"], m["GPU instance"], m["compute instance"])
        for m in report.mig_devices
    ]
    assert seen == [
        ("0", str(i), mockstate.mig_uuid(0, i), f"NVIDIA A100-SXM4-40GB MIG {p}", str(i + 1), "0")
        for i, p in enumerate(PROFILES)
    ]
    assert [m["memory MiB"] for m in report.mig_devices] == ["5120", "10240", "5120"]  # eighths of the GPU's 40960
    text = format_report(report)
    assert f"    MIG devices: 3\n    MIG device 0:\n      uuid: {mockstate.mig_uuid(0, 0)}\n" in text, text
    assert text.index("MIG device 2:") < text.index("  GPU 1:"), text  # under the GPU it is on


def test_compute_instance_profiles_fit_their_gpu_instance(mig: Nvml) -> None:
    parent = mig.handles()[0]
    gi = handle_out(mig, "nvmlDeviceGetGpuInstanceById", parent, ctypes.c_uint(2))  # the 2g.10gb one
    c = CiProfileInfo()
    ok = []
    for j in range(8):
        try:
            mig.call(
                "nvmlGpuInstanceGetComputeInstanceProfileInfo", gi, ctypes.c_uint(j), ctypes.c_uint(0), ctypes.byref(c)
            )
            ok.append((j, c.slices, c.instances))
        except NvmlError as exc:
            assert exc.code == NOT_SUPPORTED
    assert ok == [(0, 1, 2), (1, 2, 1)]
    args = (gi, ctypes.c_uint(0), ctypes.c_uint(1), ctypes.byref(c))
    assert _code(mig.call, "nvmlGpuInstanceGetComputeInstanceProfileInfo", *args) == INVALID_ARGUMENT
    assert _code(handle_out, mig, "nvmlDeviceGetGpuInstanceById", parent, ctypes.c_uint(9)) == NOT_FOUND
    assert _code(handle_out, mig, "nvmlGpuInstanceGetComputeInstanceById", gi, ctypes.c_uint(1)) == NOT_FOUND
    assert _code(handle_out, mig, "nvmlDeviceGetGpuInstanceById", mig.handles()[1], ctypes.c_uint(1)) == NOT_SUPPORTED


def test_a_lost_gpu_takes_its_mig_devices_and_handles_survive_rewrites(mig: Nvml, state: StateFile) -> None:
    gpu = mig.handles()[0]
    migs = mig_devices(mig, gpu)
    doc = mockstate.initial_state(3, 1, PROFILES)
    doc["gpus"][0]["lost"] = True
    state.write(doc)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            mig.text("nvmlDeviceGetUUID", migs[0])
        except NvmlError as exc:
            assert exc.code == GPU_IS_LOST
            break
        time.sleep(0.02)
    else:
        raise AssertionError("the MIG device of a lost GPU still answers")
    doc["gpus"][0]["lost"] = False
    doc["gpus"][0]["mig_devices"] = doc["gpus"][0]["mig_devices"][:1]  # two MIG devices destroyed
    state.write(doc)

    def left() -> int:
        try:
            return len(mig_devices(mig, gpu))
        except NvmlError:  # still lost until the library read the new state
            return -1

    while time.monotonic() < deadline and left() != 1:
        time.sleep(0.02)
    assert mig_devices(mig, gpu) == migs[:1], "a MIG device kept its handle"
    assert _code(mig.text, "nvmlDeviceGetUUID", migs[1]) == INVALID_ARGUMENT


@pytest.mark.parametrize(
    ("migs", "problem"),
    [
        (
            [{"uuid": "MIG-a", "profile": "1g.6gb"}],
            "gpus[0].mig_devices[0].profile: '1g.6gb' is not one of this GPU's "
            "(40960 MiB): 1g.5gb, 1g.5gb+me, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb",
        ),
        (
            [{"uuid": "MIG-a", "profile": "7g.40gb"}, {"uuid": "MIG-b", "profile": "1g.5gb"}],
            "gpus[0].mig_devices: needs 8 compute and 9 memory slices; a GPU has 7 and 8",
        ),
        (
            [{"uuid": "MIG-a", "profile": "1g.5gb", "gi": 3}, {"uuid": "MIG-b", "profile": "1g.5gb", "gi": 3}],
            "gpus[0].mig_devices: GPU instance 3 appears twice",
        ),
        (
            [{"uuid": "MIG-a", "profile": "3g.20gb"}] * 1
            + [{"uuid": "MIG-b", "profile": "4g.20gb"}, {"uuid": "MIG-c", "profile": "4g.20gb"}],
            "gpus[0].mig_devices: more than 1 of profile 3",
        ),
        ([{"uuid": mockstate.gpu_uuid(1), "profile": "1g.5gb"}], f"gpus: uuid {mockstate.gpu_uuid(1)} appears twice"),
        ([{"uuid": "MIG-a", "profile": "1g.5gb", "gi": 15}], "gpus[0].mig_devices[0].gi: out of range (0..14)"),
    ],
)
def test_mig_devices_that_cannot_exist_are_refused_naming_the_problem(
    mock_lib_path: Path,
    state: StateFile,
    capfd: pytest.CaptureFixture[str],
    migs: list[dict[str, object]],
    problem: str,
) -> None:
    doc = mockstate.initial_state(2, 1)
    doc["gpus"][0].update(mig_enabled=True, mig_devices=migs)
    state.write(doc)
    assert _code(Nvml(str(mock_lib_path)).init) == DRIVER_NOT_LOADED
    err = capfd.readouterr().err
    assert problem in err, err


def test_mig_devices_need_mig_enabled(mock_lib_path: Path, state: StateFile, capfd: pytest.CaptureFixture[str]) -> None:
    doc = mockstate.initial_state(1, 1)
    doc["gpus"][0]["mig_devices"] = [{"uuid": "MIG-a", "profile": "1g.5gb"}]
    state.write(doc)
    assert _code(Nvml(str(mock_lib_path)).init) == DRIVER_NOT_LOADED
    assert 'gpus[0].mig_devices: needs "mig_enabled": true' in capfd.readouterr().err


class Placement(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


#: An A100's possible GPU instance placements (start, size in memory slices), NVIDIA's MIG user guide.
A100_PLACEMENTS = {
    0: [(s, 1) for s in range(7)],
    7: [(s, 1) for s in range(7)],
    9: [(0, 2), (2, 2), (4, 2), (6, 2)],
    1: [(0, 2), (2, 2), (4, 2)],
    2: [(0, 4), (4, 4)],
    3: [(0, 4)],
    4: [(0, 8)],
}


@pytest.mark.parametrize(
    "symbol", ["nvmlDeviceGetGpuInstancePossiblePlacements_v2", "nvmlDeviceGetGpuInstancePossiblePlacements"]
)
def test_possible_placements_of_each_profile(mig: Nvml, symbol: str) -> None:
    """NVIDIA's DRA driver lists every profile's placements (go-nvml calls ``_v2``, else the unversioned name):
    the count alone with no array, then the placements; profiles an A100 lacks and GPUs without MIG: NOT_SUPPORTED."""
    gpu = mig.handles()[1]
    seen = {}
    for profile in range(17):
        count = ctypes.c_uint()
        try:
            mig.call(symbol, gpu, ctypes.c_uint(profile), None, ctypes.byref(count))
        except NvmlError as exc:
            assert exc.code == NOT_SUPPORTED, (profile, exc)
            continue
        out = (Placement * count.value)()
        mig.call(symbol, gpu, ctypes.c_uint(profile), out, ctypes.byref(count))
        seen[profile] = [(p.start, p.size) for p in out]
    assert seen == A100_PLACEMENTS
    assert _code(mig.call, symbol, gpu, ctypes.c_uint(0), None, None) == INVALID_ARGUMENT
    assert (
        _code(mig.call, symbol, mig.handles()[2], ctypes.c_uint(0), None, ctypes.byref(ctypes.c_uint()))
        == NOT_SUPPORTED
    )


def test_architecture_and_brand_are_an_a100s(mig: Nvml) -> None:
    """go-nvlib's GetArchitectureAsString / GetBrandAsString, which NVIDIA's DRA driver publishes as attributes."""
    for handle in [*mig.handles(), mig_devices(mig, mig.handles()[0])[0]]:
        arch, brand = ctypes.c_uint(), ctypes.c_int()
        mig.call("nvmlDeviceGetArchitecture", handle, ctypes.byref(arch))
        mig.call("nvmlDeviceGetBrand", handle, ctypes.byref(brand))
        assert (arch.value, brand.value) == (7, 14)  # NVML_DEVICE_ARCH_AMPERE, NVML_BRAND_NVIDIA
    assert _code(mig.call, "nvmlDeviceGetArchitecture", mig.handles()[0], None) == INVALID_ARGUMENT


def test_each_gpu_instance_lies_at_a_possible_placement(mig: Nvml) -> None:
    """A MIG device's GPU instance starts where its profile may start (NVIDIA's DRA driver names a MIG device by its
    placement and matches it against the possible ones): 1g.5gb at 0, 2g.10gb at 2, 1g.5gb at 4."""
    parent = mig.handles()[0]
    seen = []
    for device in mig_devices(mig, parent):
        gi_id = mig.uint("nvmlDeviceGetGpuInstanceId", device)
        gi = handle_out(mig, "nvmlDeviceGetGpuInstanceById", parent, ctypes.c_uint(gi_id))
        info = GiInfo()
        mig.call("nvmlGpuInstanceGetInfo", gi, ctypes.byref(info))
        assert (info.start, info.size) in A100_PLACEMENTS[info.profile_id], (info.profile_id, info.start, info.size)
        seen.append(info.start)
    assert seen == [0, 2, 4]
