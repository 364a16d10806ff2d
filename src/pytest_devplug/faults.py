"""The fault-injection contract: how the suite makes a plugin's devices fail, for any plugin.

The kubelet's side of a fault (allocatable drops, capacity stays, a running pod keeps its device and
reads ``Unhealthy`` in ``allocatedResourcesStatus``, a failing ``Allocate`` fails admission) is the
same for every plugin; only the way to cause it differs. A plugin project says how by overriding the
``devplug_faults`` fixture in its conftest.py with an object that has these methods; the included
GPU plugin's is :class:`MockNvmlFaults`, which edits the mock-NVML state file (the same JSON the C mock
library reads, so it reaches any NVML plugin started on the mock). Without an injector the fault tests
skip (or fail, ``--devplug-missing-faults=fail``) naming this contract.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from .errors import FaultNotSupportedError

if TYPE_CHECKING:
    from .handles import PluginHandle

__all__ = [
    "FaultInjector",
    "MockNvmlFaults",
    "NvmlXidFaults",
    "CONTRACT",
    "fault_domain",
    "fail_pre_start",
]

#: What a ``devplug_faults`` fixture must return, in one line (quoted by skips and errors).
CONTRACT = (
    "pytest_devplug.FaultInjector: device_ids, set_unhealthy(id), set_healthy(id), fail_allocate(id=None), "
    "add_device() -> id, remove_device(id); optional: fail_pre_start(id=None), fault_domain(id)"
)


@runtime_checkable
class FaultInjector(Protocol):
    """Makes the plugin under test see faults; every change shows up in the plugin's ``ListAndWatch``
    or ``Allocate``. The fixture that returns it undoes its changes in its teardown (the suite then
    redeploys the plugin anyway).

    Two methods are optional, looked up when a check needs them (an injector written before them stays one):
    ``fail_pre_start(device_id=None)``, making ``PreStartContainer`` return an error for requests including
    ``device_id`` (``None``: every device), for a plugin that registers with ``pre_start_required``; and
    ``fault_domain(device_id)`` (see :func:`fault_domain`)."""

    @property
    def device_ids(self) -> list[str]:
        """The device IDs the plugin lists now, as the kubelet sees them."""
        ...

    def set_unhealthy(self, device_id: str) -> None:
        """Make the plugin report ``device_id`` Unhealthy."""
        ...

    def set_healthy(self, device_id: str) -> None:
        """Make the plugin report ``device_id`` Healthy again."""
        ...

    def fail_allocate(self, device_id: str | None = None) -> None:
        """Make ``Allocate`` return an error for requests including ``device_id`` (``None``: every device)."""
        ...

    def add_device(self) -> str:
        """Make the plugin list one more (healthy) device; returns its ID."""
        ...

    def remove_device(self, device_id: str) -> None:
        """Make the plugin stop listing ``device_id``."""
        ...


def fault_domain(injector: FaultInjector, device_id: str) -> list[str]:
    """The devices a fault made through ``device_id`` reaches (sorted): all the devices backed by the same
    hardware (replicas of one GPU), where the injector knows it (a ``fault_domain(id)`` method), else just
    ``device_id`` (an injector of a conftest faults exactly the device it is given)."""
    domain = getattr(injector, "fault_domain", None)
    return sorted(domain(device_id)) if callable(domain) else [device_id]


def fail_pre_start(injector: FaultInjector, device_id: str | None = None) -> None:
    """Make the plugin's ``PreStartContainer`` fail (for requests including ``device_id``; ``None``: every device)
    through the injector's optional ``fail_pre_start``; raises :class:`FaultNotSupportedError` naming the method
    when the injector has none."""
    method = getattr(injector, "fail_pre_start", None)
    if not callable(method):
        raise FaultNotSupportedError(
            f"the fault injector ({type(injector).__name__}) has no fail_pre_start(device_id=None) method (optional "
            "in the contract: make PreStartContainer return an error)"
        )
    method(device_id)


class _OnMockState:
    """An injector that acts through the plugin's mock-NVML state (``PluginHandle.mock``).

    It speaks the plugin's device IDs: each is mapped to the mock GPU backing it
    (:mod:`pytest_devplug.backing`), and a fault of that GPU reaches every device it backs.
    """

    def __init__(self, plugin: PluginHandle) -> None:
        self._plugin = plugin
        self._mock = plugin.mock

    @property
    def device_ids(self) -> list[str]:
        return self._plugin.node.device_ids(self._plugin.resource_name)

    def _gpu(self, device_id: str) -> str:
        try:
            return self._mock.backing_gpu(device_id)
        except LookupError as exc:
            raise FaultNotSupportedError(f"cannot tell which mock GPU to fault: {exc}") from None

    def fault_domain(self, device_id: str) -> list[str]:
        """The plugin's devices backed by the same mock GPU as ``device_id`` (itself included)."""
        gpu = self._gpu(device_id)
        return sorted({device_id, *self._mock.backed_devices().get(gpu, [])})

    def inject_ecc_error(self, device_id: str) -> None:
        """An uncorrectable ECC error on the mock GPU backing ``device_id``, as NVML reports one (counts, a
        DoubleBitEcc event, Xid 48). Beyond the contract: no check needs it, a test of NVML health handling may."""
        self._mock.inject_ecc_error(self._gpu(device_id))


class MockNvmlFaults(_OnMockState):
    """The contract on the mock NVML: edits the mock-state JSON (``lost``, ``fail_allocate``, ``fail_pre_start``,
    ``gpus``).

    Unhealthy is a lost GPU (not an Xid) so that :meth:`set_healthy` can undo it: the included
    plugin's health policy keeps a GPU with a critical Xid Unhealthy until it is reset. Removing a
    device removes the GPU backing it, with every device it backs.
    """

    def set_unhealthy(self, device_id: str) -> None:
        self._mock.set_lost(self._gpu(device_id))

    def set_healthy(self, device_id: str) -> None:
        self._mock.set_usable(self._gpu(device_id))

    def fail_allocate(self, device_id: str | None = None) -> None:
        for uuid in self._mock.uuids if device_id is None else [self._gpu(device_id)]:
            self._mock.fail_allocate(uuid)

    def fail_pre_start(self, device_id: str | None = None) -> None:
        for uuid in self._mock.uuids if device_id is None else [self._gpu(device_id)]:
            self._mock.fail_pre_start(uuid)

    def add_device(self) -> str:
        return self._mock.add_gpu(numa_node=0)

    def remove_device(self, device_id: str) -> None:
        self._mock.remove_gpu(self._gpu(device_id))


class NvmlXidFaults(_OnMockState):
    """The contract for someone else's plugin on the mock NVML (e.g. NVIDIA's k8s-device-plugin): only
    what NVML itself says, with the meaning every NVML plugin gives it.

    Unhealthy is a critical Xid (79: the GPU fell off the bus). The other faults have no NVML meaning,
    or none NVML plugins agree on, so they raise :class:`FaultNotSupportedError` saying why (the tests
    needing them skip, quoting it): NVML reports no recovery, and NVIDIA's plugin keeps a GPU Unhealthy
    after a critical Xid until it restarts; NVML has no hot-plug event, and NVIDIA's plugin enumerates
    GPUs once at start; ``fail_allocate`` is read by the included plugin only. Health monitoring itself
    is the ``nvml-xid`` convention: for a plugin that does not declare it (``xid_health=False``), an Xid
    proves nothing and :meth:`set_unhealthy` raises :class:`FaultNotSupportedError` too.
    """

    def __init__(self, plugin: PluginHandle, *, xid_health: bool = True) -> None:
        super().__init__(plugin)
        self._xid_health = xid_health

    def set_unhealthy(self, device_id: str) -> None:
        if not self._xid_health:
            raise FaultNotSupportedError(
                "on the mock NVML a device turns unhealthy through a critical Xid, and the plugin under test does "
                "not declare NVML health monitoring (--devplug-conventions nvml-xid)"
            )
        self._mock.inject_xid(self._gpu(device_id), 79)

    def set_healthy(self, device_id: str) -> None:
        raise FaultNotSupportedError(
            "NVML has no event for a GPU that recovered; after a critical Xid NVIDIA's k8s-device-plugin keeps "
            "the GPU Unhealthy until it restarts (clearing it on a lost-and-back GPU is the included plugin's policy)"
        )

    def fail_allocate(self, device_id: str | None = None) -> None:
        raise FaultNotSupportedError(
            "a failing Allocate has no NVML meaning: fail_allocate in the mock-NVML state is read by the included "
            "plugin only"
        )

    def fail_pre_start(self, device_id: str | None = None) -> None:
        raise FaultNotSupportedError(
            "a failing PreStartContainer has no NVML meaning: fail_pre_start in the mock-NVML state is read by the "
            "included plugin only"
        )

    def add_device(self) -> str:
        raise FaultNotSupportedError(
            "NVML has no hot-plug event: a plugin such as NVIDIA's k8s-device-plugin enumerates GPUs once at start"
        )

    def remove_device(self, device_id: str) -> None:
        raise FaultNotSupportedError(
            "NVML has no hot-unplug event: a plugin such as NVIDIA's k8s-device-plugin enumerates GPUs once at start"
        )


# Conformance stated where a type checker sees it (the fixture is annotated with the Protocol too).
_: type[FaultInjector] = MockNvmlFaults
_xid: type[FaultInjector] = NvmlXidFaults
