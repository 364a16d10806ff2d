"""DRA drivers under test: fixtures, handles, assertion helpers and a conformance suite, like the device-plugin ones.

``objects`` makes and reads ``resource.k8s.io/v1`` objects (DeviceClasses, ResourceClaims, templates,
ResourceSlices) through the API server; ``handles`` reads the driver, its node's kubelet, claims and pods
naturally in a test; ``assertions`` holds the ``assert_*`` helpers; ``faults`` the fault-injection contract;
``plugin`` the pytest options and fixtures; ``conformance`` the shipped suite
(``devplug conformance --dra`` or ``pytest --pyargs pytest_devplug.dra.conformance``).

The names a test or a ``conftest.py`` needs are here, in ``__all__``: ``from pytest_devplug.dra import DriverSpec``.
"""

from ..backends.dra import DRACallRecord, DriverSpec, RegistrationRecord
from .assertions import (
    assert_claim_prepared,
    assert_dra_checkpoint_survives_kubelet_restart,
    assert_driver_registered,
    assert_driver_reregisters_after_kubelet_restart,
    assert_slices_published,
)
from .faults import DRAFaultInjector, DRAMockNvmlFaults, DRANvmlXidFaults
from .handles import ClaimFactory, ClaimHandle, ClaimPodHandle, DRANodeHandle, DriverHandle
from .objects import AllocatedDevice, DRACheckpoint, PreparedClaim, PreparedDevice, SliceView

__all__ = [
    # backends.dra: what to deploy, and what the kubelet's DRA side recorded
    "DRACallRecord",
    "DriverSpec",
    "RegistrationRecord",
    # assertions
    "assert_claim_prepared",
    "assert_dra_checkpoint_survives_kubelet_restart",
    "assert_driver_registered",
    "assert_driver_reregisters_after_kubelet_restart",
    "assert_slices_published",
    # faults
    "DRAFaultInjector",
    "DRAMockNvmlFaults",
    "DRANvmlXidFaults",
    # handles
    "ClaimFactory",
    "ClaimHandle",
    "ClaimPodHandle",
    "DRANodeHandle",
    "DriverHandle",
    # objects: what the handles return
    "AllocatedDevice",
    "DRACheckpoint",
    "PreparedClaim",
    "PreparedDevice",
    "SliceView",
]
