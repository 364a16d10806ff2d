"""The DRA fault-injection contract: how the suite makes a driver's devices fail or its calls fail, for any driver.

The kubelet's side of a fault is the same for every driver (a pod stays Pending with
``FailedPrepareDynamicResources`` and runs once a retry succeeds; an unprepare is retried until it works; a
device the health stream reports Unhealthy reads so in the pod's ``allocatedResourcesStatus``); only the way
to cause it differs. A driver project says how by overriding the ``devplug_dra_faults`` fixture with an object
that has these members. Without one, the checks that need a fault skip naming :data:`DRA_CONTRACT`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from ..backends import mockstate
from ..errors import FaultNotSupportedError
from .handles import DriverHandle

__all__ = ["DRA_CONTRACT", "DRAFaultInjector", "DRAMockNvmlFaults", "DRANvmlXidFaults"]

#: What a ``devplug_dra_faults`` fixture must return, in one line (quoted by skips and errors).
DRA_CONTRACT = (
    "pytest_devplug.dra.faults.DRAFaultInjector: devices -> [(pool, device)], set_unhealthy(pool, device), "
    "set_healthy(pool, device), fail_prepare(fail=True), fail_unprepare(fail=True)"
)


@runtime_checkable
class DRAFaultInjector(Protocol):
    """Makes the driver under test see faults. A method that cannot make its fault raises
    :class:`FaultNotSupportedError`; only the check needing it skips, quoting the message."""

    @property
    def devices(self) -> list[tuple[str, str]]:
        """(pool, device) of the devices the driver publishes now."""
        ...

    def set_unhealthy(self, pool: str, device: str) -> None:
        """Make the driver's ``NodeWatchResources`` stream report the device Unhealthy."""
        ...

    def set_healthy(self, pool: str, device: str) -> None:
        """Make the stream report the device Healthy again."""
        ...

    def fail_prepare(self, fail: bool = True) -> None:
        """Make ``NodePrepareResources`` answer an error for every claim (``False``: succeed again)."""
        ...

    def fail_unprepare(self, fail: bool = True) -> None:
        """Make ``NodeUnprepareResources`` answer an error for every claim (``False``: succeed again)."""
        ...


class _OnMockState:
    """An injector acting through the driver's mock-NVML state; a device is mapped to its GPU by the ``uuid``
    attribute the driver publishes for it (a MIG device's UUID: its GPU, as NVML's Xids and losses are GPU-wide)."""

    def __init__(
        self,
        driver: DriverHandle,
        read_state: Callable[[], dict[str, Any]],
        write_state: Callable[[dict[str, Any]], None],
    ) -> None:
        self._driver = driver
        self._read = read_state
        self._write = write_state

    @property
    def devices(self) -> list[tuple[str, str]]:
        return self._driver.devices()

    def _uuid(self, pool: str, device: str) -> str:
        for s in self._driver.slices():
            if s.pool == pool and device in s.devices:
                attr = (s.device(device).get("attributes") or {}).get("uuid") or {}
                value = attr.get("string") if isinstance(attr, dict) else None
                if value:
                    return self._gpu_of(str(value))
                raise FaultNotSupportedError(
                    f"device {pool}/{device} publishes no uuid attribute to find its mock GPU by"
                )
        raise FaultNotSupportedError(f"the driver publishes no device {pool}/{device}")

    def _gpu_of(self, uuid: str) -> str:
        for gpu in self._read().get("gpus") or []:
            if uuid in (gpu.get("uuid"), *(m.get("uuid") for m in gpu.get("mig_devices") or [])):
                return str(gpu["uuid"])
        return uuid  # not the mock's: the state edit names it

    def _edit(self, change: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        self._driver.mark_changed(devices=True)
        self._write(change(self._read()))

    def fail_unprepare(self, fail: bool = True) -> None:
        raise FaultNotSupportedError("a failing NodeUnprepareResources has no meaning in the mock-NVML state")


class DRAMockNvmlFaults(_OnMockState):
    """The contract for the included GPU plugin's DRA mode, through the meanings its mock-NVML state has for it:
    Unhealthy is a lost GPU (so that :meth:`set_healthy` can undo it: a GPU answering again is Healthy), a failing
    prepare is ``fail_allocate`` on every GPU. NVML has no notion of a failing unprepare."""

    def set_unhealthy(self, pool: str, device: str) -> None:
        uuid = self._uuid(pool, device)
        self._edit(lambda st: mockstate.with_lost(st, uuid, True))

    def set_healthy(self, pool: str, device: str) -> None:
        uuid = self._uuid(pool, device)
        self._edit(lambda st: mockstate.with_lost(st, uuid, False))

    def fail_prepare(self, fail: bool = True) -> None:
        def change(st: dict[str, Any]) -> dict[str, Any]:
            for gpu in st["gpus"]:
                st = mockstate.with_fail_allocate(st, str(gpu["uuid"]), fail)
            return st

        self._edit(change)


class DRANvmlXidFaults(_OnMockState):
    """The contract for someone else's driver on the mock NVML: only what NVML itself says. Unhealthy is a critical
    Xid (79); NVML has no event for a GPU that recovered (an Xid stays until the driver restarts) and no notion of a
    failing prepare, so those raise :class:`FaultNotSupportedError`."""

    def set_unhealthy(self, pool: str, device: str) -> None:
        uuid = self._uuid(pool, device)
        self._edit(lambda st: mockstate.with_xid(st, uuid, 79))

    def set_healthy(self, pool: str, device: str) -> None:
        raise FaultNotSupportedError(
            "NVML has no event for a GPU that recovered: after a critical Xid the GPU stays Unhealthy "
            "until the driver restarts"
        )

    def fail_prepare(self, fail: bool = True) -> None:
        raise FaultNotSupportedError(
            "a failing NodePrepareResources has no NVML meaning (fail_allocate is read by the included driver only)"
        )


# Conformance stated where a type checker sees it.
_: type[DRAFaultInjector] = DRAMockNvmlFaults
_xid: type[DRAFaultInjector] = DRANvmlXidFaults
