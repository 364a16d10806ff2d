"""pytest-devplug: end-to-end tests for Kubernetes device plugins.

The public API: the ``assert_*`` helpers, the handles the fixtures return, and the backend data types
a ``conftest.py`` needs to point the fixtures at its own plugin (:class:`PluginSpec`). ``__all__`` lists them once,
grouped like the imports (``tests/pytest_plugin/test_public_surface.py`` holds the two equal); the DRA side's are in
:mod:`pytest_devplug.dra`. A name renamed or removed since an earlier release still answers an import: see
:mod:`pytest_devplug._renames`.
"""

import typing as _typing

from . import _renames
from .assertions import (
    assert_allocatable,
    assert_allocate_injections,
    assert_checkpoint_survives_kubelet_restart,
    assert_devices_unhealthy,
    assert_limit_rules,
    assert_registered,
    assert_reregisters_after_kubelet_restart,
)
from .backends.base import (
    Checkpoint,
    CheckpointEntry,
    ContainerView,
    DeviceNodeView,
    ExecResult,
    MountView,
    NodeSpec,
    PluginSpec,
    PodResourcesContainer,
    PodResourcesDevices,
    PodResourcesPod,
)
from .errors import (
    BackendError,
    BackendUnavailableError,
    ContainerStatusMissingError,
    DevplugAssertionError,
    DevplugError,
    FaultNotSupportedError,
    MockControlsUnavailableError,
    ObjectNotFoundError,
    PodRejectedError,
    UnsupportedOperationError,
    WaitAbandoned,
    WaitTimeout,
)
from .faults import FaultInjector, MockNvmlFaults, NvmlXidFaults
from .handles import ClusterHandle, MockNvml, NodeHandle, PluginHandle, PodFactory, PodHandle
from .waiting import wait_for

__all__ = [
    # assertions
    "assert_allocatable",
    "assert_allocate_injections",
    "assert_checkpoint_survives_kubelet_restart",
    "assert_devices_unhealthy",
    "assert_limit_rules",
    "assert_registered",
    "assert_reregisters_after_kubelet_restart",
    # backends.base: what a conftest points the fixtures at, and what the handles return
    "Checkpoint",
    "CheckpointEntry",
    "ContainerView",
    "DeviceNodeView",
    "ExecResult",
    "MountView",
    "NodeSpec",
    "PluginSpec",
    "PodResourcesContainer",
    "PodResourcesDevices",
    "PodResourcesPod",
    # errors
    "BackendError",
    "BackendUnavailableError",
    "ContainerStatusMissingError",
    "DevplugAssertionError",
    "DevplugError",
    "FaultNotSupportedError",
    "MockControlsUnavailableError",
    "ObjectNotFoundError",
    "PodRejectedError",
    "UnsupportedOperationError",
    "WaitAbandoned",
    "WaitTimeout",
    # faults
    "FaultInjector",
    "MockNvmlFaults",
    "NvmlXidFaults",
    # handles
    "ClusterHandle",
    "MockNvml",
    "NodeHandle",
    "PluginHandle",
    "PodFactory",
    "PodHandle",
    # waiting
    "wait_for",
]


# Hidden from type checkers: a module __getattr__ would make them accept any name imported from the package.
if not _typing.TYPE_CHECKING:

    def __getattr__(name: str) -> object:
        """A name of an earlier release: a renamed one gives its successor (warning), a removed one names it."""
        return globals()[_renames.successor(name)]
