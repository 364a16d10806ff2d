"""pytest-devplug: end-to-end tests for Kubernetes device plugins.

The public API: the ``assert_*`` helpers, the handles the fixtures return, and the backend data types
a ``conftest.py`` needs to point the fixtures at its own plugin (:class:`PluginSpec`).
"""

from .assertions import (
    assert_allocatable,
    assert_devices_unhealthy,
    assert_allocate_injections,
    assert_checkpoint_survives_kubelet_restart,
    assert_gpu_limit_rules,
    assert_limit_rules,
    assert_registered,
    assert_reregisters_after_kubelet_restart,
)
from .backends.base import (
    BackendError,
    BackendUnavailableError,
    Checkpoint,
    CheckpointEntry,
    ContainerView,
    DeviceNodeView,
    ExecResult,
    MountView,
    NodeSpec,
    PluginSpec,
    PodRejectedError,
    PodResourcesContainer,
    PodResourcesDevices,
    PodResourcesPod,
    UnsupportedOperationError,
)
from .errors import ContainerStatusMissingError, DevplugError, ObjectNotFoundError, WaitAbandoned
from .evidence import DevplugAssertionError
from .faults import FaultInjector, FaultNotSupportedError, MockNvmlFaults, NvmlXidFaults
from .handles import (
    ClusterHandle,
    MockControlsUnavailableError,
    MockNvml,
    NodeHandle,
    PluginHandle,
    PodFactory,
    PodHandle,
)
from .waiting import WaitTimeout, wait_for

__all__ = [
    "assert_allocatable",
    "assert_devices_unhealthy",
    "assert_allocate_injections",
    "assert_checkpoint_survives_kubelet_restart",
    "assert_gpu_limit_rules",
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
