"""pytest-devplug: end-to-end tests for Kubernetes device plugins.

The public API: the ``assert_*`` helpers, the handles the fixtures return, and the backend data types
a ``conftest.py`` needs to point the fixtures at its own plugin (:class:`PluginSpec`).
"""

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
    "assert_allocatable",
    "assert_devices_unhealthy",
    "assert_allocate_injections",
    "assert_checkpoint_survives_kubelet_restart",
    "assert_limit_rules",
    "assert_registered",
    "assert_reregisters_after_kubelet_restart",
    "BackendError",
    "BackendUnavailableError",
    "Checkpoint",
    "CheckpointEntry",
    "ClusterHandle",
    "ContainerStatusMissingError",
    "ContainerView",
    "DeviceNodeView",
    "DevplugAssertionError",
    "DevplugError",
    "ExecResult",
    "FaultInjector",
    "FaultNotSupportedError",
    "MockControlsUnavailableError",
    "MockNvml",
    "MockNvmlFaults",
    "NvmlXidFaults",
    "MountView",
    "NodeHandle",
    "NodeSpec",
    "ObjectNotFoundError",
    "PluginHandle",
    "PluginSpec",
    "PodFactory",
    "PodHandle",
    "PodRejectedError",
    "PodResourcesContainer",
    "PodResourcesDevices",
    "PodResourcesPod",
    "UnsupportedOperationError",
    "WaitTimeout",
    "WaitAbandoned",
    "wait_for",
]
