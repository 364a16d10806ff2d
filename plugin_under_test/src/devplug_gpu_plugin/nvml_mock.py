"""A mock ``libnvidia-ml`` for ``pynvml``, fed by the JSON mock-state file.

The plugin has one NVML code path, through :mod:`pynvml`. In ``--nvml mock`` mode this module
replaces only the library boundary: :func:`install` puts a function table of ctypes
``CFUNCTYPE`` callbacks (same C signatures as libnvidia-ml) at ``pynvml.nvmlLib`` before
``pynvml.nvmlInit()``. pynvml then writes through pointers, passes opaque handles and reads
``NVML_*`` return codes exactly as with the real library.

State file contract (docs/design.md): ``gpus`` (uuid, name, memory_mib, numa_node, minor,
lost, fail_allocate) and the append-only ``events`` list (``{"uuid", "xid"}``). The file is
re-read on every atomic rewrite (inotify); a malformed rewrite keeps the last good state.
Events present when the mock is installed are history and are not delivered (a plugin
restart starts with clean health); each entry appended later is delivered once.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import threading
import time
from collections import deque
from ctypes import POINTER, c_char, c_int, c_uint, c_ulong, c_ulonglong
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

import pynvml

from .watch import IN_CLOSE_WRITE, IN_MOVED_TO, Inotify

log = logging.getLogger("devplug_gpu_plugin.nvml_mock")

NVML_ERROR_GPU_IS_LOST: int = pynvml.NVML_ERROR_GPU_IS_LOST
NVML_ERROR_INSUFFICIENT_SIZE: int = pynvml.NVML_ERROR_INSUFFICIENT_SIZE
NVML_ERROR_INVALID_ARGUMENT: int = pynvml.NVML_ERROR_INVALID_ARGUMENT
NVML_ERROR_NOT_SUPPORTED: int = pynvml.NVML_ERROR_NOT_SUPPORTED
NVML_ERROR_TIMEOUT: int = pynvml.NVML_ERROR_TIMEOUT
NVML_ERROR_UNINITIALIZED: int = pynvml.NVML_ERROR_UNINITIALIZED
NVML_ERROR_UNKNOWN: int = pynvml.NVML_ERROR_UNKNOWN
NVML_SUCCESS: int = pynvml.NVML_SUCCESS
XID_CRITICAL_EVENT: int = pynvml.nvmlEventTypeXidCriticalError

_HANDLE_BASE = 0x10000
_EVENT_SET_BASE = 0x90000
_MOCK_DRIVER_VERSION = b"550.54.15-mock"
_MIB = 1024 * 1024


class MockStateError(ValueError):
    """The mock-state file is missing or malformed; the message names the file and the problem."""


@dataclass(frozen=True)
class MockGpu:
    uuid: str
    name: str
    memory_mib: int
    numa_node: int | None
    minor: int
    lost: bool
    fail_allocate: bool


@dataclass(frozen=True)
class MockEvent:
    uuid: str
    xid: int


@dataclass(frozen=True)
class MockState:
    gpus: tuple[MockGpu, ...]
    events: tuple[MockEvent, ...]


def _field(obj: dict[str, Any], key: str, kind: type, where: str, default: Any = ...) -> Any:
    if key not in obj:
        if default is ...:
            raise MockStateError(f"{where}: missing field {key!r}")
        return default
    value = obj[key]
    # bool is an int subclass: refuse it where an int is meant.
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        raise MockStateError(f"{where}: field {key!r} must be {kind.__name__}, got {value!r}")
    return value


def parse_state(text: str, path: str) -> MockState:
    """Validate the JSON text of a mock-state file; errors name ``path`` and the problem."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MockStateError(f"mock state {path}: invalid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise MockStateError(f"mock state {path}: top level must be an object")
    raw_gpus = doc.get("gpus")
    if not isinstance(raw_gpus, list):
        raise MockStateError(f"mock state {path}: 'gpus' must be a list")
    gpus: list[MockGpu] = []
    seen_uuid: set[str] = set()
    seen_minor: set[int] = set()
    for i, g in enumerate(raw_gpus):
        where = f"mock state {path}: gpus[{i}]"
        if not isinstance(g, dict):
            raise MockStateError(f"{where}: must be an object")
        uuid = _field(g, "uuid", str, where)
        if not uuid:
            raise MockStateError(f"{where}: 'uuid' must not be empty")
        numa = g.get("numa_node")
        if numa is not None and (isinstance(numa, bool) or not isinstance(numa, int) or numa < 0):
            raise MockStateError(f"{where}: field 'numa_node' must be a non-negative int or null, got {numa!r}")
        minor = _field(g, "minor", int, where)
        if minor < 0:
            raise MockStateError(f"{where}: field 'minor' must be >= 0")
        if uuid in seen_uuid:
            raise MockStateError(f"{where}: duplicate uuid {uuid!r}")
        if minor in seen_minor:
            raise MockStateError(f"{where}: duplicate minor {minor}")
        seen_uuid.add(uuid)
        seen_minor.add(minor)
        gpus.append(
            MockGpu(
                uuid=uuid,
                name=_field(g, "name", str, where, "NVIDIA Mock GPU"),
                memory_mib=_field(g, "memory_mib", int, where, 16384),
                numa_node=numa,
                minor=minor,
                lost=_field(g, "lost", bool, where, False),
                fail_allocate=_field(g, "fail_allocate", bool, where, False),
            )
        )
    raw_events = doc.get("events", [])
    if not isinstance(raw_events, list):
        raise MockStateError(f"mock state {path}: 'events' must be a list")
    events: list[MockEvent] = []
    for i, e in enumerate(raw_events):
        where = f"mock state {path}: events[{i}]"
        if not isinstance(e, dict):
            raise MockStateError(f"{where}: must be an object")
        events.append(MockEvent(_field(e, "uuid", str, where), _field(e, "xid", int, where)))
    return MockState(tuple(gpus), tuple(events))


def load_state(path: str) -> MockState:
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise MockStateError(f"mock state {path}: cannot read: {exc.strerror or exc}") from None
    return parse_state(text, path)


# C types of the NVML API as pynvml declares them.
_Dev = pynvml.c_nvmlDevice_t
_Set = pynvml.c_nvmlEventSet_t
_P = POINTER
_F = TypeVar("_F", bound=Callable[..., int])


def _addr(ptr: Any) -> int:
    """Opaque handle -> its integer value (0 for NULL)."""
    return ctypes.cast(ptr, ctypes.c_void_p).value or 0


class _Table:
    """Attribute bag standing in for the CDLL: pynvml does ``getattr(nvmlLib, name)``."""

    nvmlErrorString: Callable[[int], bytes]


class MockNvml:
    """The mock library: state, handles, event sets and the ctypes function table."""

    def __init__(self, path: str, state: MockState) -> None:
        self.path = path
        self._cond = threading.Condition()
        self._state = state
        self._generation = 0
        self._handles: dict[str, int] = {}  # uuid -> opaque handle value, stable, never reused
        self._event_sets: dict[int, dict[int, int]] = {}  # set -> {handle: event mask}
        self._set_generation: dict[int, int] = {}
        self._pending: deque[MockEvent] = deque()
        self._delivered = len(state.events)
        self._initialized = 0
        self._watcher: Inotify | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._assign_handles(state)
        self.table = self._build_table()

    # ---- state -------------------------------------------------------------------------------
    @property
    def state(self) -> MockState:
        with self._cond:
            return self._state

    def allocate_fault(self, uuid: str) -> str | None:
        """Why ``Allocate`` must fail for ``uuid`` (``fail_allocate: true``), else None."""
        with self._cond:
            for g in self._state.gpus:
                if g.uuid == uuid and g.fail_allocate:
                    return f"fail_allocate is set for {uuid} in mock state {self.path}"
        return None

    def _assign_handles(self, state: MockState) -> None:
        for g in state.gpus:
            if g.uuid not in self._handles:
                self._handles[g.uuid] = _HANDLE_BASE + 0x10 * len(self._handles)

    def apply(self, state: MockState) -> None:
        """Adopt a new state: queue newly appended events and wake every event waiter."""
        with self._cond:
            if len(state.events) < self._delivered:
                log.error(
                    "mock state %s: events shrank from %d to %d entries (the list is append-only); "
                    "only entries beyond %d will be delivered",
                    self.path, self._delivered, len(state.events), self._delivered,
                )
            else:
                self._pending.extend(state.events[self._delivered :])
                self._delivered = len(state.events)
            self._state = state
            self._assign_handles(state)
            self._generation += 1
            self._cond.notify_all()
        log.info("mock state %s loaded: %d GPUs, %d events", self.path, len(state.gpus), len(state.events))

    def reload(self) -> bool:
        """Re-read the file; on a malformed file keep the last good state and log why."""
        try:
            state = load_state(self.path)
        except MockStateError as exc:
            log.error("%s; keeping the last good mock state", exc)
            return False
        self.apply(state)
        return True

    def start_watching(self) -> None:
        """Follow atomic rewrites of the state file (rename into its directory)."""
        watcher = Inotify()
        directory = os.path.dirname(os.path.abspath(self.path))
        watcher.add_watch(directory, IN_CLOSE_WRITE | IN_MOVED_TO)
        self._watcher = watcher
        name = os.path.basename(self.path)

        def loop() -> None:
            while not self._stopping:
                try:
                    events = watcher.read(None)
                except (OSError, ValueError):
                    return
                if any(e.name == name for e in events) and not self._stopping:
                    self.reload()

        self._thread = threading.Thread(target=loop, name="mock-state-watch", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stopping = True
        with self._cond:
            self._cond.notify_all()
        if self._watcher is not None:
            self._watcher.wake()
            if self._thread is not None:
                self._thread.join(2)
            self._watcher.close()
            self._watcher = None

    # ---- lookups (call with the lock held) ---------------------------------------------------
    def _gpu_by_handle(self, handle: Any) -> tuple[int, MockGpu | None]:
        """NVML_SUCCESS and the GPU, or the error code a real library gives for this handle."""
        value = _addr(handle)
        if not value:
            return NVML_ERROR_INVALID_ARGUMENT, None
        if not self._initialized:
            return NVML_ERROR_UNINITIALIZED, None
        for g in self._state.gpus:
            if self._handles.get(g.uuid) == value:
                if g.lost:
                    return NVML_ERROR_GPU_IS_LOST, None
                return NVML_SUCCESS, g
        return NVML_ERROR_INVALID_ARGUMENT, None  # removed from the system

    # ---- the C functions ---------------------------------------------------------------------
    def _build_table(self) -> _Table:
        table = _Table()

        def c_func(name: str, restype: Any, *argtypes: Any) -> Callable[[_F], _F]:
            proto = ctypes.CFUNCTYPE(restype, *argtypes)

            def register(impl: _F) -> _F:
                def guarded(*args: Any) -> int:
                    # An exception escaping a ctypes callback would return 0 (= NVML_SUCCESS).
                    try:
                        return impl(*args)
                    except Exception:
                        log.exception("mock NVML %s failed", name)
                        return NVML_ERROR_UNKNOWN

                setattr(table, name, proto(guarded))
                return impl

            return register

        def write_str(buf: Any, size: int, value: bytes) -> int:
            if not buf:
                return NVML_ERROR_INVALID_ARGUMENT
            if len(value) + 1 > size:
                return NVML_ERROR_INSUFFICIENT_SIZE
            ctypes.memmove(buf, value + b"\0", len(value) + 1)
            return NVML_SUCCESS

        @c_func("nvmlInitWithFlags", c_int, c_uint)
        def _init(flags: int) -> int:
            with self._cond:
                self._initialized += 1
            return NVML_SUCCESS

        @c_func("nvmlInit_v2", c_int)
        def _init_v2() -> int:
            return _init(0)

        @c_func("nvmlShutdown", c_int)
        def _shutdown() -> int:
            with self._cond:
                if not self._initialized:
                    return NVML_ERROR_UNINITIALIZED
                self._initialized -= 1
                self._cond.notify_all()
            return NVML_SUCCESS

        @c_func("nvmlSystemGetDriverVersion", c_int, _P(c_char), c_uint)
        def _driver(buf: Any, size: int) -> int:
            return write_str(buf, size, _MOCK_DRIVER_VERSION)

        @c_func("nvmlDeviceGetCount_v2", c_int, _P(c_uint))
        def _count(out: Any) -> int:
            with self._cond:
                if not self._initialized:
                    return NVML_ERROR_UNINITIALIZED
                out[0] = len(self._state.gpus)
            return NVML_SUCCESS

        @c_func("nvmlDeviceGetHandleByIndex_v2", c_int, c_uint, _P(_Dev))
        def _by_index(index: int, out: Any) -> int:
            with self._cond:
                if not self._initialized:
                    return NVML_ERROR_UNINITIALIZED
                if not out or index >= len(self._state.gpus):
                    return NVML_ERROR_INVALID_ARGUMENT
                value = self._handles[self._state.gpus[index].uuid]
            out[0] = ctypes.cast(ctypes.c_void_p(value), _Dev)
            return NVML_SUCCESS

        def on_gpu(fn: Callable[[MockGpu], int]) -> Callable[..., int]:
            def call(handle: Any) -> int:
                with self._cond:
                    rc, gpu = self._gpu_by_handle(handle)
                if gpu is None:
                    return rc
                return fn(gpu)

            return call

        @c_func("nvmlDeviceGetUUID", c_int, _Dev, _P(c_char), c_uint)
        def _uuid(handle: Any, buf: Any, size: int) -> int:
            return on_gpu(lambda g: write_str(buf, size, g.uuid.encode()))(handle)

        @c_func("nvmlDeviceGetName", c_int, _Dev, _P(c_char), c_uint)
        def _name(handle: Any, buf: Any, size: int) -> int:
            return on_gpu(lambda g: write_str(buf, size, g.name.encode()))(handle)

        @c_func("nvmlDeviceGetMemoryInfo", c_int, _Dev, _P(pynvml.c_nvmlMemory_t))
        def _memory(handle: Any, out: Any) -> int:
            def fill(g: MockGpu) -> int:
                total = g.memory_mib * _MIB
                out.contents.total = total
                out.contents.free = total
                out.contents.used = 0
                return NVML_SUCCESS

            return on_gpu(fill)(handle)

        @c_func("nvmlDeviceGetMinorNumber", c_int, _Dev, _P(c_uint))
        def _minor(handle: Any, out: Any) -> int:
            def fill(g: MockGpu) -> int:
                out[0] = g.minor
                return NVML_SUCCESS

            return on_gpu(fill)(handle)

        @c_func("nvmlDeviceGetNumaNodeId", c_int, _Dev, _P(c_int))
        def _numa(handle: Any, out: Any) -> int:
            def fill(g: MockGpu) -> int:
                if g.numa_node is None:
                    return NVML_ERROR_NOT_SUPPORTED
                out[0] = g.numa_node
                return NVML_SUCCESS

            return on_gpu(fill)(handle)

        # unsigned long *cpuSet: declared void* because pynvml passes byref(c_ulonglong array).
        @c_func("nvmlDeviceGetCpuAffinity", c_int, _Dev, c_uint, ctypes.c_void_p)
        def _affinity(handle: Any, size: int, address: int | None) -> int:
            if not address:
                return NVML_ERROR_INVALID_ARGUMENT
            out = ctypes.cast(address, _P(c_ulong))

            # A made-up topology: NUMA node n owns CPUs 8n..8n+7.
            def fill(g: MockGpu) -> int:
                for i in range(size):
                    out[i] = 0
                if g.numa_node is None:
                    return NVML_ERROR_NOT_SUPPORTED
                bits = ctypes.sizeof(c_ulong) * 8
                first = g.numa_node * 8
                for cpu in range(first, first + 8):
                    if cpu // bits < size:
                        out[cpu // bits] |= 1 << (cpu % bits)
                return NVML_SUCCESS

            return on_gpu(fill)(handle)

        @c_func("nvmlDeviceGetSupportedEventTypes", c_int, _Dev, _P(c_ulonglong))
        def _supported(handle: Any, out: Any) -> int:
            def fill(g: MockGpu) -> int:
                out[0] = XID_CRITICAL_EVENT
                return NVML_SUCCESS

            return on_gpu(fill)(handle)

        @c_func("nvmlEventSetCreate", c_int, _P(_Set))
        def _set_create(out: Any) -> int:
            with self._cond:
                if not self._initialized:
                    return NVML_ERROR_UNINITIALIZED
                value = _EVENT_SET_BASE + 0x10 * (len(self._set_generation) + 1)
                self._event_sets[value] = {}
                self._set_generation[value] = self._generation
            out[0] = ctypes.cast(ctypes.c_void_p(value), _Set)
            return NVML_SUCCESS

        @c_func("nvmlEventSetFree", c_int, _Set)
        def _set_free(event_set: Any) -> int:
            with self._cond:
                if self._event_sets.pop(_addr(event_set), None) is None:
                    return NVML_ERROR_INVALID_ARGUMENT
                self._cond.notify_all()
            return NVML_SUCCESS

        @c_func("nvmlDeviceRegisterEvents", c_int, _Dev, c_ulonglong, _Set)
        def _register(handle: Any, types: int, event_set: Any) -> int:
            with self._cond:
                rc, gpu = self._gpu_by_handle(handle)
                if gpu is None:
                    return rc
                members = self._event_sets.get(_addr(event_set))
                if members is None:
                    return NVML_ERROR_INVALID_ARGUMENT
                if types & ~XID_CRITICAL_EVENT:
                    return NVML_ERROR_NOT_SUPPORTED
                members[_addr(handle)] = members.get(_addr(handle), 0) | types
                self._cond.notify_all()  # queued events for this GPU may now be deliverable
            return NVML_SUCCESS

        @c_func("nvmlEventSetWait_v2", c_int, _Set, _P(pynvml.c_nvmlEventData_t), c_uint)
        def _wait(event_set: Any, out: Any, timeout_ms: int) -> int:
            key = _addr(event_set)
            with self._cond:
                end = time.monotonic() + timeout_ms / 1000.0
                while True:
                    members = self._event_sets.get(key)
                    if members is None:
                        return NVML_ERROR_INVALID_ARGUMENT
                    if self._stopping or not self._initialized:
                        return NVML_ERROR_UNINITIALIZED
                    event = self._take_event(members)
                    if event is not None:
                        handle, xid = event
                        out.contents.device = ctypes.cast(ctypes.c_void_p(handle), _Dev)
                        out.contents.eventType = XID_CRITICAL_EVENT
                        out.contents.eventData = xid
                        out.contents.gpuInstanceId = 0xFFFFFFFF
                        out.contents.computeInstanceId = 0xFFFFFFFF
                        return NVML_SUCCESS
                    if self._set_generation[key] != self._generation:
                        # The state changed since this set last woke: wake now so the caller
                        # re-probes (device count, lost GPUs) without waiting for the timeout.
                        self._set_generation[key] = self._generation
                        return NVML_ERROR_TIMEOUT
                    remaining = end - time.monotonic()
                    if remaining <= 0:
                        return NVML_ERROR_TIMEOUT
                    self._cond.wait(remaining)

        def error_string(code: int) -> bytes:
            text = pynvml.NVMLError._errcode_to_string.get(code, f"Unknown NVML error {code}")
            return str(text).encode()

        table.nvmlErrorString = error_string
        return table

    def _take_event(self, members: dict[int, int]) -> tuple[int, int] | None:
        """Pop the first pending Xid for a GPU registered in this set (lock held).

        Events naming a GPU that is not in the state are dropped with a log line; events for
        a GPU nobody has registered yet stay queued until it is.
        """
        known = {g.uuid for g in self._state.gpus}
        for event in list(self._pending):
            if event.uuid not in known:
                log.warning("mock state %s: Xid %d names unknown GPU %s; dropped", self.path, event.xid, event.uuid)
                self._pending.remove(event)
                continue
            handle = self._handles[event.uuid]
            if members.get(handle, 0) & XID_CRITICAL_EVENT:
                self._pending.remove(event)
                return handle, event.xid
        return None


def install(path: str) -> MockNvml:
    """Load ``path`` (raises :class:`MockStateError`) and make it pynvml's library.

    Must run before ``pynvml.nvmlInit()``. pynvml caches function pointers per name, so the
    cache is cleared too (matters when tests install more than one mock in a process).
    """
    mock = MockNvml(path, load_state(path))
    with pynvml.libLoadLock:
        pynvml.nvmlLib = mock.table
        pynvml._nvmlGetFunctionPointer_cache.clear()
    return mock
