"""The kubelet's fixed periods that plugins see, declared once for every layer that models or waits on them.

Each is a constant in ``pkg/kubelet`` with the same value in every release the harness pins (1.34 to
1.38.0-beta.0, read from each release's source), so none of them is a per-release rule of :mod:`.releases`.
"""

from __future__ import annotations

__all__ = [
    "DRA_RECONCILE_PERIOD_S",
    "DRA_WIPING_DELAY_S",
    "ENDPOINT_STOP_GRACE_PERIOD_S",
    "PLEG_RELIST_PERIOD_S",
    "POD_BACKOFF_PERIOD_S",
]

#: How long the device manager keeps a resource's devices after its plugin went away before it drops them
#: (``endpointStopGracePeriod``, ``cm/devicemanager/types.go``: five minutes).
ENDPOINT_STOP_GRACE_PERIOD_S = 300.0

#: How long after a DRA driver's last plugin went away the kubelet deletes its ResourceSlices
#: (``defaultWipingDelay``, ``cm/dra/manager.go``: 30 s).
DRA_WIPING_DELAY_S = 30.0

#: How often the DRA manager's loop unprepares the claims of pods no longer active (``defaultReconcilePeriod``,
#: ``cm/dra/manager.go``: one minute).
DRA_RECONCILE_PERIOD_S = 60.0

#: How long after a failed sync the pod worker syncs the pod again (``backOffPeriod``, ``kubelet.go``: 10 s);
#: a failed unprepare is such a failure.
POD_BACKOFF_PERIOD_S = 10.0

#: How often the kubelet lists the node's containers to notice one that exited (``genericPlegRelistPeriod``,
#: ``kubelet.go``: one second). A container is started again only after a relist saw it gone, and a replacement
#: pod passes the DaemonSet controller, the scheduler and a new sandbox first: two starts of a plugin's container
#: on a real node come this far apart or more, but for a container that dies within its first relist period
#: (plugins that name their socket after their start second, as squat's generic-device-plugin does, rely on it).
PLEG_RELIST_PERIOD_S = 1.0
