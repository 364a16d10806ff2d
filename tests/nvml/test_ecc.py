"""An uncorrectable (double-bit) ECC error on the mock NVML, as NVML reports one on a real GPU.

ECC mode enabled, the uncorrected counts grow, a DoubleBitEcc event reaches the sets registered for it and the
Xid 48 the driver logs for a DBE reaches those registered for Xids (NVIDIA's device plugin acts on that one).
"""

from __future__ import annotations

from ctypes import byref, c_int, c_ulonglong
from pathlib import Path

import pytest

from pytest_devplug.backends import mockstate
from pytest_devplug.nvml.probe import EventData, Handle, Nvml
from pytest_devplug.errors import NvmlError

from .nvml_helpers import StateFile

INVALID_ARGUMENT, NOT_SUPPORTED, DRIVER_NOT_LOADED, TIMEOUT = 2, 3, 9, 10
SINGLE_BIT, DOUBLE_BIT, PSTATE, XID = 0x1, 0x2, 0x4, 0x8
CORRECTED, UNCORRECTED = 0, 1
VOLATILE, AGGREGATE = 0, 1
L2_CACHE, DEVICE_MEMORY = 1, 2
#: Long enough for the watcher to re-read the state (inotify: milliseconds); the wait returns at the event.
WAIT_MS = 10_000


def _code(fn: object, *args: object) -> int:
    with pytest.raises(NvmlError) as info:
        fn(*args)  # type: ignore[operator]
    return info.value.code


def _total(nvml: Nvml, h: Handle, error: int, counter: int) -> int:
    out = c_ulonglong()
    nvml.call("nvmlDeviceGetTotalEccErrors", h, c_int(error), c_int(counter), byref(out))
    return out.value


def _at(nvml: Nvml, h: Handle, error: int, counter: int, location: int) -> int:
    out = c_ulonglong()
    nvml.call("nvmlDeviceGetMemoryErrorCounter", h, c_int(error), c_int(counter), c_int(location), byref(out))
    return out.value


def _counts(nvml: Nvml, h: Handle) -> dict[str, int]:
    return {
        "uncorrected volatile": _total(nvml, h, UNCORRECTED, VOLATILE),
        "uncorrected aggregate": _total(nvml, h, UNCORRECTED, AGGREGATE),
        "corrected volatile": _total(nvml, h, CORRECTED, VOLATILE),
        "corrected aggregate": _total(nvml, h, CORRECTED, AGGREGATE),
        "uncorrected in device memory": _at(nvml, h, UNCORRECTED, AGGREGATE, DEVICE_MEMORY),
        "uncorrected in L2": _at(nvml, h, UNCORRECTED, AGGREGATE, L2_CACHE),
    }


def _event(data: EventData) -> tuple[int, int, int]:
    return data.device, data.eventType, data.eventData


def test_ecc_is_enabled_and_the_ecc_events_are_supported(nvml: Nvml) -> None:
    h = nvml.handles()[0]
    current, pending = c_int(), c_int()
    nvml.call("nvmlDeviceGetEccMode", h, byref(current), byref(pending))
    assert (current.value, pending.value) == (1, 1), "ECC mode must be NVML_FEATURE_ENABLED, current and pending"
    assert nvml.supported_events(h) == SINGLE_BIT | DOUBLE_BIT | XID
    es = nvml.event_set()
    assert _code(nvml.register_events, h, PSTATE, es) == NOT_SUPPORTED
    nvml.free_event_set(es)


def test_an_uncorrectable_error_grows_that_gpus_uncorrected_counts(nvml: Nvml, state: StateFile) -> None:
    handles = nvml.handles()
    zero = dict.fromkeys(_counts(nvml, handles[1]), 0)
    assert _counts(nvml, handles[1]) == zero
    es = nvml.event_set()
    nvml.register_events(handles[1], DOUBLE_BIT, es)
    doc = mockstate.initial_state(4, 2)
    for _ in range(2):
        doc = mockstate.with_ecc_error(doc, mockstate.gpu_uuid(1))
        state.write(doc)
        nvml.wait(es, WAIT_MS)  # the error has been taken in
    nvml.free_event_set(es)
    two = {**zero, "uncorrected volatile": 2, "uncorrected aggregate": 2, "uncorrected in device memory": 2}
    assert _counts(nvml, handles[1]) == two
    assert [_counts(nvml, h) for h in (handles[0], handles[2], handles[3])] == [zero] * 3, "another GPU's counts grew"


def test_events_reach_only_the_sets_registered_for_their_type(nvml: Nvml, state: StateFile) -> None:
    """DoubleBitEcc (eventData 0) to the ECC sets, then Xid 48 to the Xid sets: NVIDIA's device plugin registers
    Xid|DBE|SBE and skips the DBE, acting on the Xid."""
    h = nvml.handles()[2]
    sets = {mask: nvml.event_set() for mask in (SINGLE_BIT | DOUBLE_BIT | XID, XID, DOUBLE_BIT, SINGLE_BIT)}
    for mask, es in sets.items():
        nvml.register_events(h, mask, es)
    state.write(mockstate.with_ecc_error(mockstate.initial_state(4, 2), mockstate.gpu_uuid(2)))
    dbe, xid48 = (h.value, DOUBLE_BIT, 0), (h.value, XID, 48)
    everything = sets[SINGLE_BIT | DOUBLE_BIT | XID]
    assert [_event(nvml.wait(everything, WAIT_MS)), _event(nvml.wait(everything, WAIT_MS))] == [dbe, xid48]
    assert _event(nvml.wait(sets[XID], WAIT_MS)) == xid48, "a set registered for Xids only got the ECC event"
    assert _event(nvml.wait(sets[DOUBLE_BIT], WAIT_MS)) == dbe
    for mask, es in sets.items():
        assert _code(nvml.wait, es, 100) == TIMEOUT, f"the set registered for {mask:#x} got an event it did not ask for"
        nvml.free_event_set(es)


def test_errors_present_at_init_are_counted_not_delivered(mock_lib_path: Path, state: StateFile) -> None:
    state.write(mockstate.with_ecc_error(mockstate.initial_state(2, 1), mockstate.gpu_uuid(0)))
    nvml = Nvml(str(mock_lib_path))
    nvml.init()
    try:
        h = nvml.handles()[0]
        assert _total(nvml, h, UNCORRECTED, AGGREGATE) == 1
        es = nvml.event_set()
        nvml.register_events(h, DOUBLE_BIT | XID, es)
        assert _code(nvml.wait, es, 100) == TIMEOUT, "an error from before nvmlInit was delivered"
        nvml.free_event_set(es)
    finally:
        nvml.shutdown()


def test_counters_refuse_what_nvml_does_not_define(nvml: Nvml) -> None:
    h = nvml.handles()[0]
    assert _code(_total, nvml, h, 2, VOLATILE) == INVALID_ARGUMENT, "error type 2 (NVML_MEMORY_ERROR_TYPE_COUNT)"
    assert _code(_total, nvml, h, UNCORRECTED, 2) == INVALID_ARGUMENT, "counter type 2 (NVML_ECC_COUNTER_TYPE_COUNT)"
    assert _code(_at, nvml, h, UNCORRECTED, VOLATILE, 8) == INVALID_ARGUMENT, "location 8 (NVML_MEMORY_LOCATION_COUNT)"
    assert (
        _code(nvml.call, "nvmlDeviceGetTotalEccErrors", h, c_int(UNCORRECTED), c_int(VOLATILE), None)
        == INVALID_ARGUMENT
    )
    assert _code(nvml.call, "nvmlDeviceGetEccMode", h, byref(c_int()), None) == INVALID_ARGUMENT


def test_a_mig_device_handle_has_no_ecc_counts(mock_lib_path: Path, state: StateFile) -> None:
    """The counts are its GPU's (nvmlDeviceGetTotalEccErrors takes a GPU handle)."""
    state.write(mockstate.with_ecc_error(mockstate.initial_state(1, 1, ["1g.5gb"]), mockstate.gpu_uuid(0)))
    nvml = Nvml(str(mock_lib_path))
    nvml.init()
    try:
        (gpu,) = nvml.handles()
        ((_, mig),) = nvml.mig_devices(gpu)
        assert _total(nvml, gpu, UNCORRECTED, VOLATILE) == 1
        assert _code(_total, nvml, mig, UNCORRECTED, VOLATILE) == NOT_SUPPORTED
    finally:
        nvml.shutdown()


NEEDS_ONE = 'events[0]: needs either "xid" (an Xid number) or "ecc": "uncorrected"'


@pytest.mark.parametrize(
    ("event", "problem"),
    [
        ('{"uuid": "GPU-a", "ecc": "uncorrected", "xid": 48}', f"{NEEDS_ONE}, not both"),
        ('{"uuid": "GPU-a"}', NEEDS_ONE),
        ('{"uuid": "GPU-a", "ecc": "corrected"}', 'events[0].ecc: must be "uncorrected"'),
        ('{"uuid": "GPU-a", "ecc": true}', 'events[0].ecc: must be "uncorrected"'),
        ('{"uuid": "GPU-a", "ecc": "uncorrected", "ecc": "uncorrected"}', "events[0].ecc: given twice"),
        ('{"ecc": "uncorrected"}', "events[0].uuid: missing"),
    ],
)
def test_a_bad_ecc_entry_is_refused_naming_the_problem(
    mock_lib_path: Path, state: StateFile, capfd: pytest.CaptureFixture[str], event: str, problem: str
) -> None:
    state.write('{"gpus": [{"uuid": "GPU-a", "minor": 0}], "events": [%s]}' % event)
    nvml = Nvml(str(mock_lib_path))
    rc = int(nvml.lib.nvmlInit_v2())
    if rc == 0:
        nvml.shutdown()  # the next test's nvmlInit must read its own state
    err = capfd.readouterr().err
    assert rc == DRIVER_NOT_LOADED, f"nvmlInit answered {rc}, not DRIVER_NOT_LOADED, for the event {event}"
    assert problem in err, err


def test_with_ecc_error_appends_an_entry_for_a_known_gpu_only() -> None:
    before = mockstate.with_xid(mockstate.initial_state(2, 1), mockstate.gpu_uuid(0), 79)
    after = mockstate.with_ecc_error(before, mockstate.gpu_uuid(1))
    assert after["events"] == [*before["events"], {"uuid": mockstate.gpu_uuid(1), "ecc": "uncorrected"}]
    assert len(before["events"]) == 1, "the state given was changed"
    with pytest.raises(KeyError, match="no mock GPU 'GPU-none'"):
        mockstate.with_ecc_error(before, "GPU-none")
