"""The mock libnvidia-ml.so.1 behaves as NVML does, through its C ABI (ctypes, NVML's struct layouts)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pytest_devplug.backends import mockstate
from pytest_devplug.nvml import STATE_ENV
from pytest_devplug.nvml.build import find_compiler
from pytest_devplug.nvml.probe import Handle, Nvml
from pytest_devplug.errors import NvmlError

from .nvml_helpers import StateFile

UNINITIALIZED, INVALID_ARGUMENT, NOT_SUPPORTED, NOT_FOUND = 1, 2, 3, 6
DRIVER_NOT_LOADED, TIMEOUT, GPU_IS_LOST = 9, 10, 15
XID = 0x8


def _code(fn: object, *args: object) -> int:
    with pytest.raises(NvmlError) as info:
        fn(*args)  # type: ignore[operator]
    return info.value.code


def test_init_and_shutdown_are_reference_counted(nvml: Nvml) -> None:
    nvml.init()
    nvml.shutdown()
    assert nvml.uint("nvmlDeviceGetCount_v2") == 4, "still initialised after one of two shutdowns"
    nvml.shutdown()
    assert _code(nvml.uint, "nvmlDeviceGetCount_v2") == UNINITIALIZED
    assert _code(nvml.shutdown) == UNINITIALIZED


def test_devices_as_the_state_describes_them(nvml: Nvml) -> None:
    handles = nvml.handles()
    assert len(handles) == 4
    for index, h in enumerate(handles):
        uuid = nvml.text("nvmlDeviceGetUUID", h)
        assert uuid == mockstate.gpu_uuid(index)
        assert nvml.handle_by_uuid(uuid) == h
        assert nvml.text("nvmlDeviceGetName", h) == "NVIDIA A100-SXM4-40GB"
        assert nvml.uint("nvmlDeviceGetMinorNumber", h) == index
        assert nvml.uint("nvmlDeviceGetIndex", h) == index
        assert nvml.memory_total(h) == 40960 << 20
        assert nvml.uint("nvmlDeviceGetNumaNodeId", h) == index // 2
        assert nvml.compute_capability(h) == "8.0"
        assert nvml.pci_bus_id(h) == f"000010DE:00:{index:02X}.0"
        assert nvml.supported_events(h) & XID
        assert _code(nvml.mig_mode, h) == NOT_SUPPORTED
    assert len(set(handles)) == 4
    assert _code(nvml.handle_by_uuid, "GPU-none") == NOT_FOUND
    assert nvml.text("nvmlSystemGetDriverVersion") == "550.54.15"


def test_numa_null_is_not_supported(mock_lib_path: Path, state: StateFile) -> None:
    state.write(mockstate.initial_state(2, 0))
    nvml = Nvml(str(mock_lib_path))
    nvml.init()
    try:
        assert _code(nvml.uint, "nvmlDeviceGetNumaNodeId", nvml.handles()[0]) == NOT_SUPPORTED
    finally:
        nvml.shutdown()


def test_event_wait_honours_its_timeout(nvml: Nvml) -> None:
    es = nvml.event_set()
    nvml.register_events(nvml.handles()[0], XID, es)
    start = time.monotonic()
    assert _code(nvml.wait, es, 300) == TIMEOUT
    assert 0.29 <= time.monotonic() - start < 2.0
    nvml.free_event_set(es)


def test_event_wait_wakes_at_once_and_delivers_each_xid_once(nvml: Nvml, state: StateFile) -> None:
    handles = nvml.handles()
    es = nvml.event_set()
    for h in handles:
        nvml.register_events(h, XID, es)
    doc = mockstate.with_xid(mockstate.initial_state(4, 2), mockstate.gpu_uuid(2), 79)
    threading.Timer(0.2, state.write, args=(doc,)).start()
    start = time.monotonic()
    data = nvml.wait(es, 20_000)
    assert time.monotonic() - start < 5.0, "the wait did not wake when the event arrived"
    assert (data.device, data.eventType, data.eventData) == (handles[2].value, XID, 79)
    assert data.gpuInstanceId == data.computeInstanceId == 0xFFFFFFFF
    assert _code(nvml.wait, es, 200) == TIMEOUT, "an event was delivered twice"
    nvml.free_event_set(es)


def test_events_present_at_init_are_history(mock_lib_path: Path, state: StateFile) -> None:
    state.write(mockstate.with_xid(mockstate.initial_state(2, 1), mockstate.gpu_uuid(0), 79))
    nvml = Nvml(str(mock_lib_path))
    nvml.init()
    try:
        es = nvml.event_set()
        nvml.register_events(nvml.handles()[0], XID, es)
        assert _code(nvml.wait, es, 100) == TIMEOUT
        nvml.free_event_set(es)
    finally:
        nvml.shutdown()


def _wait_until(cond: object, what: str) -> None:
    deadline = time.monotonic() + 10
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_lost_gpu_answers_gpu_is_lost_and_wakes_the_wait_once(nvml: Nvml, state: StateFile) -> None:
    handles = nvml.handles()
    es = nvml.event_set()
    nvml.register_events(handles[1], XID, es)
    doc = mockstate.with_lost(mockstate.initial_state(4, 2), mockstate.gpu_uuid(1), True)
    state.write(doc)
    assert _code(nvml.wait, es, 10_000) == GPU_IS_LOST
    assert _code(nvml.text, "nvmlDeviceGetUUID", handles[1]) == GPU_IS_LOST
    assert _code(nvml.wait, es, 100) == TIMEOUT, "a lost GPU is reported by the wait once"
    state.write(mockstate.with_lost(doc, mockstate.gpu_uuid(1), False))
    _wait_until(lambda: _uuid_or_code(nvml, handles[1]) == mockstate.gpu_uuid(1), "the GPU to answer again")
    nvml.free_event_set(es)


def _uuid_or_code(nvml: Nvml, handle: Handle) -> str | int:
    try:
        return nvml.text("nvmlDeviceGetUUID", handle)
    except NvmlError as exc:
        return exc.code


def test_handles_stay_stable_across_changes(nvml: Nvml, state: StateFile) -> None:
    before = nvml.handles()
    doc, added = mockstate.with_gpu_added(mockstate.initial_state(4, 2))
    state.write(mockstate.with_gpu_removed(doc, mockstate.gpu_uuid(0)))
    _wait_until(
        lambda: nvml.uint("nvmlDeviceGetCount_v2") == 4 and _uuid_or_code(nvml, before[0]) != mockstate.gpu_uuid(0),
        "the change",
    )
    after = nvml.handles()
    assert after[:3] == before[1:]
    assert nvml.text("nvmlDeviceGetUUID", after[3]) == added
    assert _code(nvml.text, "nvmlDeviceGetUUID", before[0]) == INVALID_ARGUMENT, (
        "a removed GPU's handle must be invalid"
    )


def test_bad_rewrite_keeps_the_last_good_state_and_says_so_once(
    nvml: Nvml, state: StateFile, capfd: pytest.CaptureFixture[str]
) -> None:
    state.write('{"gpus": [}')
    time.sleep(0.3)
    state.write('{"gpus": [}')
    time.sleep(0.3)
    assert nvml.uint("nvmlDeviceGetCount_v2") == 4
    err = capfd.readouterr().err
    assert err.count("invalid JSON") == 1, err
    assert str(state.path) in err and "keeping the last good state" in err
    state.write(mockstate.initial_state(3, 1))
    _wait_until(lambda: nvml.uint("nvmlDeviceGetCount_v2") == 3, "the good rewrite to apply")


BIG = 1 << 64


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"gpus": [{"uuid": "GPU-a", "minor": 4294967296}]}', "gpus[0].minor: out of range"),
        ('{"gpus": [{"uuid": "GPU-a", "minor": -1}]}', "gpus[0].minor: must not be negative"),
        ('{"gpus": [{"uuid": "GPU-a", "minor": 1.5}]}', "gpus[0].minor: must be an integer"),
        ('{"gpus": [{"uuid": "GPU-a", "minor": 0, "numa_node": 2147483648}]}', "gpus[0].numa_node: out of range"),
        (
            '{"gpus": [{"uuid": "GPU-a", "minor": 0}], "events": [{"uuid": "GPU-a", "xid": %d}]}' % (BIG + 13),
            "events[0].xid: out of range",
        ),
        (
            '{"gpus": [{"uuid": "GPU-a", "minor": 0}], "events": [{"uuid": "GPU-a", "xid": -1}]}',
            "events[0].xid: must not be negative",
        ),
        ('{"gpus": [{"uuid": "A\\u0000x", "minor": 0}]}', "gpus[0].uuid: must be printable ASCII"),
        ('{"gpus": [{"uuid": "%s", "minor": 0}]}' % ("G" * 96), "gpus[0].uuid: longer than NVML's 95-byte limit"),
        ('{"gpus": [{"uuid": "GPU-a", "minor": 0}, {"uuid": "GPU-a", "minor": 1}]}', "uuid GPU-a appears twice"),
        ('{"gpus": [{"uuid": "GPU-a", "minor": 0}, {"uuid": "GPU-b", "minor": 0}]}', "minor 0 appears twice"),
        ('{"gpus": [{"uuid": "GPU-a", "minor": 0, "minor": 1}]}', "gpus[0].minor: given twice"),
        ('{"gpus": ' + "[" * 40 + "]" * 40 + "}", "nested deeper than 32 levels"),
        (b'{"gpus": [{"uuid": "GPU-\xff", "minor": 0}]}', "not UTF-8"),
        ('{"gpus": [{"uuid": "GPU-a", "minor": 0, "lost": 1}]}', "gpus[0].lost: must be true or false"),
        ("[]", "must be a JSON object"),
    ],
)
def test_bad_state_at_init_is_refused_naming_the_problem(
    mock_lib_path: Path, state: StateFile, capfd: pytest.CaptureFixture[str], text: str | bytes, problem: str
) -> None:
    """Issue 11.2's inputs: numbers never wrap, UUIDs never merge or drop, bad bytes never crash."""
    state.write(text)
    nvml = Nvml(str(mock_lib_path))
    assert _code(nvml.init) == DRIVER_NOT_LOADED
    err = capfd.readouterr().err
    assert problem in err and str(state.path) in err, err


def test_boundaries_are_accepted(mock_lib_path: Path, state: StateFile) -> None:
    """The largest values the limits allow are kept exactly."""
    uuid = "G" * 95
    state.write(
        {
            "gpus": [{"uuid": uuid, "minor": 4294967295, "numa_node": 1023, "memory_mib": 1}],
            "events": [{"uuid": uuid, "xid": BIG - 1}],
        }
    )
    nvml = Nvml(str(mock_lib_path))
    nvml.init()
    try:
        (h,) = nvml.handles()
        assert nvml.text("nvmlDeviceGetUUID", h) == uuid
        assert nvml.uint("nvmlDeviceGetMinorNumber", h) == 4294967295
        assert nvml.uint("nvmlDeviceGetNumaNodeId", h) == 1023
    finally:
        nvml.shutdown()


def test_no_state_variable_is_a_clear_error(
    mock_lib_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("DEVPLUG_NVML_STATE", raising=False)
    assert _code(Nvml(str(mock_lib_path)).init) == DRIVER_NOT_LOADED
    assert "DEVPLUG_NVML_STATE is not set" in capfd.readouterr().err


def test_topology_answers_of_pcie_only_gpus(nvml: Nvml) -> None:
    """go-gpuallocator (NVIDIA's GetPreferredAllocation) asks these: same NUMA node = NODE, else SYSTEM, no NVLink."""
    h = nvml.handles()
    level = ctypes.c_int()

    def common(a: Handle, b: Handle) -> int:
        nvml.call("nvmlDeviceGetTopologyCommonAncestor", a, b, ctypes.byref(level))
        return level.value

    assert (common(h[0], h[0]), common(h[0], h[1]), common(h[0], h[2])) == (0, 40, 50)
    with pytest.raises(NvmlError) as info:
        nvml.call("nvmlDeviceGetNvLinkState", h[0], ctypes.c_uint(0), ctypes.byref(level))
    assert info.value.code == NOT_SUPPORTED


NO_INOTIFY_SHIM = """
#include <errno.h>
int inotify_init1(int flags) { (void)flags; errno = EMFILE; return -1; }
"""

EVENT_WITHOUT_INOTIFY = """
import sys, threading, time
from pytest_devplug.backends import mockstate
from pytest_devplug.nvml.probe import Nvml
from tests.nvml.nvml_helpers import StateFile

state = StateFile(__import__("pathlib").Path(sys.argv[2]))
nvml = Nvml(sys.argv[1])
nvml.init()
es = nvml.event_set()
nvml.register_events(nvml.handles()[1], 0x8, es)
doc = mockstate.with_xid(mockstate.initial_state(4, 2), mockstate.gpu_uuid(1), 79)
threading.Timer(0.2, state.write, args=(doc,)).start()
data = nvml.wait(es, 10_000)
print("xid", data.eventData)
"""


def test_changes_are_seen_without_inotify(mock_lib_path: Path, state: StateFile, tmp_path: Path) -> None:
    """With the user's inotify instances used up (inotify_init1 failing EMFILE), the library looks at the file
    instead: an Xid written after nvmlInit still wakes the wait."""
    shim = tmp_path / "no_inotify.so"
    (tmp_path / "no_inotify.c").write_text(NO_INOTIFY_SHIM)
    subprocess.run([*find_compiler(), "-shared", "-fPIC", "-o", str(shim), str(tmp_path / "no_inotify.c")], check=True)
    env = {**os.environ, "LD_PRELOAD": str(shim), STATE_ENV: str(state.path)}
    done = subprocess.run(
        [sys.executable, "-c", EVENT_WITHOUT_INOTIFY, str(mock_lib_path), str(state.path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=Path(__file__).parents[2],
    )
    assert done.returncode == 0 and "xid 79" in done.stdout, done.stdout + done.stderr
