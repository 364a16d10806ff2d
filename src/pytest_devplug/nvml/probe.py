"""``devplug nvml probe``: what an NVML library reports, read through ctypes with NVML's own layouts.

It works on any ``libnvidia-ml.so.1`` (a GPU node's driver or the mock), so the mock's answers can be
compared with a real library's side by side. Each value is read on its own: a call that fails shows its
NVML error instead of ending the probe. A MIG-enabled GPU's MIG devices are listed as go-nvlib visits them
(every index up to ``nvmlDeviceGetMaxMigDeviceCount``, the empty ones skipped).
"""

from __future__ import annotations

import ctypes
from ctypes import byref, c_char, c_int, c_uint, c_ulonglong, c_void_p
from dataclasses import dataclass, field
from typing import Any

from ..errors import NvmlError

__all__ = ["Handle", "Nvml", "probe", "format_report"]

NVML_SUCCESS = 0
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_TIMEOUT = 10
NVML_DEVICE_MIG_ENABLE = 1
EVENT_TYPES = {
    0x1: "SingleBitEccError",
    0x2: "DoubleBitEccError",
    0x4: "PState",
    0x8: "XidCriticalError",
    0x10: "Clock",
    0x20: "PowerSourceChange",
    0x40: "MigConfigChange",
}
_BUF = 96  # NVML_DEVICE_UUID_V2_BUFFER_SIZE / NAME_V2; >= the driver version buffer's 80


@dataclass(frozen=True)
class Handle:
    """An NVML device or event-set handle (an opaque pointer); ctypes passes it as a pointer."""

    value: int

    @property
    def _as_parameter_(self) -> c_void_p:
        return c_void_p(self.value)


class _Memory(ctypes.Structure):
    _fields_ = [("total", c_ulonglong), ("free", c_ulonglong), ("used", c_ulonglong)]


class _PciInfo(ctypes.Structure):
    _fields_ = [
        ("busIdLegacy", c_char * 16),
        ("domain", c_uint),
        ("bus", c_uint),
        ("device", c_uint),
        ("pciDeviceId", c_uint),
        ("pciSubSystemId", c_uint),
        ("busId", c_char * 32),
    ]


class EventData(ctypes.Structure):
    _fields_ = [
        ("device", c_void_p),
        ("eventType", c_ulonglong),
        ("eventData", c_ulonglong),
        ("gpuInstanceId", c_uint),
        ("computeInstanceId", c_uint),
    ]


class Nvml:
    """A thin, typed view of the NVML calls a device plugin makes (raises :class:`NvmlError`)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lib = ctypes.CDLL(path)
        self.lib.nvmlErrorString.restype = ctypes.c_char_p
        self.lib.nvmlErrorString.argtypes = [c_int]

    def call(self, name: str, *args: Any) -> None:
        fn = getattr(self.lib, name)
        rc = int(fn(*args))
        if rc != NVML_SUCCESS:
            raise NvmlError(name, rc, (self.lib.nvmlErrorString(rc) or b"?").decode(errors="replace"))

    def text(self, name: str, *args: Any) -> str:
        buf = ctypes.create_string_buffer(_BUF)
        self.call(name, *args, buf, c_uint(_BUF))
        return buf.value.decode(errors="replace")

    def uint(self, name: str, *args: Any) -> int:
        out = c_uint()
        self.call(name, *args, byref(out))
        return out.value

    def init(self) -> None:
        self.call("nvmlInit_v2")

    def shutdown(self) -> None:
        self.call("nvmlShutdown")

    def handles(self) -> list[Handle]:
        out = []
        for index in range(self.uint("nvmlDeviceGetCount_v2")):
            handle = c_void_p()
            self.call("nvmlDeviceGetHandleByIndex_v2", c_uint(index), byref(handle))
            out.append(Handle(handle.value or 0))
        return out

    def handle_by_uuid(self, uuid: str) -> Handle:
        handle = c_void_p()
        self.call("nvmlDeviceGetHandleByUUID", uuid.encode(), byref(handle))
        return Handle(handle.value or 0)

    def memory_total(self, handle: Handle) -> int:
        mem = _Memory()
        self.call("nvmlDeviceGetMemoryInfo", handle, byref(mem))
        return int(mem.total)

    def pci_bus_id(self, handle: Handle) -> str:
        pci = _PciInfo()
        self.call("nvmlDeviceGetPciInfo_v3", handle, byref(pci))
        return bytes(pci.busId).decode(errors="replace")

    def compute_capability(self, handle: Handle) -> str:
        major, minor = c_int(), c_int()
        self.call("nvmlDeviceGetCudaComputeCapability", handle, byref(major), byref(minor))
        return f"{major.value}.{minor.value}"

    def mig_mode(self, handle: Handle) -> int:
        current, pending = c_uint(), c_uint()
        self.call("nvmlDeviceGetMigMode", handle, byref(current), byref(pending))
        return current.value

    def mig_devices(self, handle: Handle) -> list[tuple[int, Handle]]:
        """(index, handle) of the MIG devices of a MIG-enabled GPU, as go-nvlib's ``VisitMigDevices`` finds them: an
        index without one answers NOT_FOUND (or INVALID_ARGUMENT) and is skipped."""
        out = []
        for index in range(self.uint("nvmlDeviceGetMaxMigDeviceCount", handle)):
            mig = c_void_p()
            try:
                self.call("nvmlDeviceGetMigDeviceHandleByIndex", handle, c_uint(index), byref(mig))
            except NvmlError as exc:
                if exc.code in (NVML_ERROR_NOT_FOUND, NVML_ERROR_INVALID_ARGUMENT):
                    continue
                raise
            out.append((index, Handle(mig.value or 0)))
        return out

    def supported_events(self, handle: Handle) -> int:
        out = c_ulonglong()
        self.call("nvmlDeviceGetSupportedEventTypes", handle, byref(out))
        return int(out.value)

    def event_set(self) -> Handle:
        out = c_void_p()
        self.call("nvmlEventSetCreate", byref(out))
        return Handle(out.value or 0)

    def register_events(self, handle: Handle, types: int, event_set: Handle) -> None:
        self.call("nvmlDeviceRegisterEvents", handle, c_ulonglong(types), event_set)

    def wait(self, event_set: Handle, timeout_ms: int) -> EventData:
        data = EventData()
        self.call("nvmlEventSetWait_v2", event_set, byref(data), c_uint(timeout_ms))
        return data

    def free_event_set(self, event_set: Handle) -> None:
        self.call("nvmlEventSetFree", event_set)


@dataclass
class Report:
    library: str
    system: dict[str, str] = field(default_factory=dict)
    devices: list[dict[str, str]] = field(default_factory=list)
    #: The MIG devices of MIG-enabled GPUs; ``gpu`` is the index of the GPU they are on.
    mig_devices: list[dict[str, str]] = field(default_factory=list)


def _ask(fn: Any, *args: Any) -> str:
    try:
        return str(fn(*args))
    except NvmlError as exc:
        return f"n/a ({exc.text})"
    except AttributeError as exc:  # the library lacks the symbol
        return f"n/a (no symbol: {exc})"


def probe(path: str) -> Report:
    """Initialise NVML from ``path``, read the system and every device, shut NVML down again."""
    nvml = Nvml(path)
    nvml.init()
    try:
        report = Report(library=path)
        cuda = c_int()

        def cuda_version() -> str:
            nvml.call("nvmlSystemGetCudaDriverVersion_v2", byref(cuda))
            return f"{cuda.value // 1000}.{cuda.value % 1000 // 10}"

        report.system = {
            "driver version": _ask(nvml.text, "nvmlSystemGetDriverVersion"),
            "NVML version": _ask(nvml.text, "nvmlSystemGetNVMLVersion"),
            "CUDA driver version": _ask(cuda_version),
        }
        for index, h in enumerate(nvml.handles()):

            def events(handle: Handle = h) -> str:
                mask = nvml.supported_events(handle)
                return ",".join(name for bit, name in EVENT_TYPES.items() if mask & bit) or "none"

            def mig(handle: Handle = h) -> str:
                return "enabled" if nvml.mig_mode(handle) == NVML_DEVICE_MIG_ENABLE else "disabled"

            device = {
                "index": str(index),
                "uuid": _ask(nvml.text, "nvmlDeviceGetUUID", h),
                "name": _ask(nvml.text, "nvmlDeviceGetName", h),
                "minor": _ask(nvml.uint, "nvmlDeviceGetMinorNumber", h),
                "memory MiB": _ask(lambda handle=h: nvml.memory_total(handle) // (1 << 20)),
                "NUMA node": _ask(nvml.uint, "nvmlDeviceGetNumaNodeId", h),
                "PCI bus id": _ask(nvml.pci_bus_id, h),
                "compute capability": _ask(nvml.compute_capability, h),
                "MIG mode": _ask(mig),
                "events": _ask(events),
            }
            report.devices.append(device)
            if device["MIG mode"] == "enabled":
                try:
                    migs = nvml.mig_devices(h)
                except NvmlError as exc:
                    device["MIG devices"] = f"n/a ({exc.text})"
                    continue
                device["MIG devices"] = str(len(migs))
                report.mig_devices += [_mig_device(nvml, index, i, m) for i, m in migs]
        return report
    finally:
        nvml.shutdown()


def _mig_device(nvml: Nvml, gpu: int, index: int, handle: Handle) -> dict[str, str]:
    return {
        "gpu": str(gpu),
        "index": str(index),
        "uuid": _ask(nvml.text, "nvmlDeviceGetUUID", handle),
        "name": _ask(nvml.text, "nvmlDeviceGetName", handle),
        "memory MiB": _ask(lambda: nvml.memory_total(handle) // (1 << 20)),
        "GPU instance": _ask(nvml.uint, "nvmlDeviceGetGpuInstanceId", handle),
        "compute instance": _ask(nvml.uint, "nvmlDeviceGetComputeInstanceId", handle),
    }


def format_report(report: Report) -> str:
    lines = [f"NVML library: {report.library}"]
    lines += [f"  {k}: {v}" for k, v in report.system.items()]
    lines.append(f"  devices: {len(report.devices)}")
    for dev in report.devices:
        lines.append(f"  GPU {dev['index']}:")
        lines += [f"    {k}: {v}" for k, v in dev.items() if k != "index"]
        for mig in (m for m in report.mig_devices if m["gpu"] == dev["index"]):
            lines.append(f"    MIG device {mig['index']}:")
            lines += [f"      {k}: {v}" for k, v in mig.items() if k not in ("gpu", "index")]
    return "\n".join(lines)
