"""NVML probing and the event loop that turns NVML events into health changes.

One loop thread owns all NVML calls after start-up. It waits on an NVML event set for
critical Xids and applies each one at once. A wait that reports a GPU lost
(``NVML_ERROR_GPU_IS_LOST``) re-probes every GPU. A quiet timeout costs two cheap questions, not a
probe of every GPU (10,000 idle GPUs must stay near 0 % of a core): has the GPU count changed, and
does a GPU that was lost answer again? Either answer yes -> a full probe.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

import pynvml

from .devices import DeviceState, GpuInfo, Probe, UnsafeDeviceIdError

log = logging.getLogger("devplug_gpu_plugin.health")

DEFAULT_IGNORED_XIDS = (13, 31, 43, 45, 68, 109)
"""Application errors, not GPU faults (the same set NVIDIA's device plugin skips)."""

WAIT_MS = 1000


def _is_lost(exc: Exception) -> bool:
    return isinstance(exc, pynvml.NVMLError) and exc.value == pynvml.NVML_ERROR_GPU_IS_LOST


def _handle_key(handle: Any) -> int:
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


class HealthMonitor:
    """Owns NVML after ``pynvml.nvmlInit()``: probes GPUs and follows Xid events."""

    def __init__(
        self,
        state: DeviceState,
        ignored_xids: Iterable[int] = DEFAULT_IGNORED_XIDS,
        on_change: Callable[[], None] | None = None,
        wait_ms: int = WAIT_MS,
    ) -> None:
        self.state = state
        self.ignored_xids = frozenset(ignored_xids)
        self.on_change = on_change
        self.wait_ms = wait_ms
        self._known: dict[int, GpuInfo] = {}  # handle -> info from when it last answered
        self._lost: dict[int, Any] = {}  # handle key -> handle, GPUs the last probe found lost
        self._count = -1  # GPU count at the last probe
        self._registered: set[int] = set()
        self._event_set: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- probing -----------------------------------------------------------------------------
    def _read_info(self, handle: Any) -> GpuInfo:
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        name = pynvml.nvmlDeviceGetName(handle)
        minor = pynvml.nvmlDeviceGetMinorNumber(handle)
        memory_mib = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total) // (1024 * 1024)
        numa: int | None
        try:
            numa = int(pynvml.nvmlDeviceGetNumaNodeId(handle))
        except pynvml.NVMLError as exc:
            if _is_lost(exc):
                raise
            numa = None  # NOT_SUPPORTED / FUNCTION_NOT_FOUND: no topology
        if numa is not None and numa < 0:
            numa = None
        return GpuInfo(uuid=str(uuid), name=str(name), minor=int(minor), numa_node=numa, memory_mib=memory_mib)

    def probe(self) -> list[Probe]:
        """Ask NVML for every GPU; a lost GPU keeps the info it had when it last answered."""
        probes: list[Probe] = []
        lost: dict[int, Any] = {}
        count = pynvml.nvmlDeviceGetCount()
        for index in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            except pynvml.NVMLError as exc:
                log.warning("NVML: no handle for GPU index %d: %s", index, exc)
                continue
            key = _handle_key(handle)
            try:
                info = self._read_info(handle)
            except pynvml.NVMLError as exc:
                known = self._known.get(key)
                if known is None:
                    log.warning("NVML: GPU index %d does not answer (%s) and was never seen; not listed", index, exc)
                    continue
                if not _is_lost(exc):
                    log.warning("NVML: GPU %s: %s; treating it as lost", known.uuid, exc)
                probes.append(Probe(known, lost=True))
                lost[key] = handle
                continue
            self._known[key] = info
            probes.append(Probe(info, lost=False))
            self._register_events(handle, key, info.uuid)
        self._lost, self._count = lost, count
        return probes

    def needs_probe(self) -> bool:
        """After a quiet timeout: did the GPU count change, or does a lost GPU answer again?"""
        try:
            if pynvml.nvmlDeviceGetCount() != self._count:
                return True
        except pynvml.NVMLError as exc:
            log.warning("NVML: device count: %s", exc)
            return False
        for handle in self._lost.values():
            try:
                pynvml.nvmlDeviceGetUUID(handle)
                return True
            except pynvml.NVMLError:
                continue
        return False

    def refresh(self) -> None:
        """Probe and publish; NVML failures are logged, never raised (the plugin keeps running)."""
        try:
            probes = self.probe()
        except pynvml.NVMLError as exc:
            log.error("NVML probe failed: %s; keeping the last device list", exc)
            return
        try:
            changes = self.state.update_inventory(probes)
        except UnsafeDeviceIdError as exc:
            log.error("%s; keeping the last device list", exc)
            return
        self._publish(changes)

    def _publish(self, changes: list[str]) -> None:
        for line in changes:
            log.info("device %s", line)
        if changes and self.on_change is not None:
            self.on_change()

    # ---- events ------------------------------------------------------------------------------
    def _register_events(self, handle: Any, key: int, uuid: str) -> None:
        if self._event_set is None or key in self._registered:
            return
        try:
            supported = int(pynvml.nvmlDeviceGetSupportedEventTypes(handle))
            mask = supported & pynvml.nvmlEventTypeXidCriticalError
            if not mask:
                log.warning("NVML: GPU %s does not report Xid events; health follows lost/back only", uuid)
            else:
                pynvml.nvmlDeviceRegisterEvents(handle, mask, self._event_set)
            self._registered.add(key)
        except pynvml.NVMLError as exc:
            log.warning("NVML: cannot register Xid events for %s: %s (will retry)", uuid, exc)

    def handle_event(self, data: Any) -> None:
        """Apply one NVML event; unknown GPUs and ignored Xids are logged, not applied."""
        if int(data.eventType) != pynvml.nvmlEventTypeXidCriticalError:
            return
        xid = int(data.eventData)
        uuid: str | None
        try:
            uuid = str(pynvml.nvmlDeviceGetUUID(data.device))
        except pynvml.NVMLError:  # e.g. lost meanwhile: fall back to what the handle was
            info = self._known.get(_handle_key(data.device))
            uuid = info.uuid if info is not None else None
        if uuid is None:
            log.warning("NVML: Xid %d on an unknown device; ignored", xid)
            return
        if xid in self.ignored_xids:
            log.info("NVML: Xid %d on %s is in the ignored list; health unchanged", xid, uuid)
            return
        log.warning("NVML: critical Xid %d on %s; marking it Unhealthy", xid, uuid)
        self._publish(self.state.mark_xid(uuid, xid))

    def start(self) -> None:
        """Create the event set, do the first probe, then follow events in a thread."""
        self._event_set = pynvml.nvmlEventSetCreate()
        self.refresh()
        self._thread = threading.Thread(target=self._loop, name="health", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                data = pynvml.nvmlEventSetWait_v2(self._event_set, self.wait_ms)
            except pynvml.NVMLError as exc:
                if self._stop.is_set():
                    break
                if exc.value == pynvml.NVML_ERROR_TIMEOUT:
                    if self.needs_probe():
                        self.refresh()
                    continue
                if not _is_lost(exc):
                    log.warning("NVML event wait: %s", exc)
                    self._stop.wait(0.1)  # don't spin on a persistent error
                self.refresh()  # a lost GPU (or an unknown failure): find out which by probing
            except Exception:  # never let the health thread die silently
                log.exception("health loop: unexpected error")
                self._stop.wait(0.1)
            else:
                try:
                    self.handle_event(data)
                except Exception:
                    log.exception("health loop: cannot handle event")

    def stop(self, timeout: float | None = None) -> bool:
        """Stop the loop; True when it ended within ``timeout`` (default: one event wait and a second).

        Only then is the event set freed: a thread still inside ``nvmlEventSetWait`` must not have its
        set freed under it. A process that is exiting passes a short timeout and skips the rest.
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.wait_ms / 1000 + 1 if timeout is None else timeout)
            if self._thread.is_alive():
                return False
        if self._event_set is not None:
            try:
                pynvml.nvmlEventSetFree(self._event_set)
            except pynvml.NVMLError:
                pass
            self._event_set = None
        return True
