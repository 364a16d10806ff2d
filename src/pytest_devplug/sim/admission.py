"""Pod admission on a node: the pod as the device manager sees it, and the kubelet's predicate admit handler.

Upstream ``pkg/kubelet/lifecycle/predicate.go`` (``predicateAdmitHandler``): node affinity (``nodeSelector``),
``NoExecute`` taints, then the node's resources against the pods it already runs, first failure wins. It runs
after the container manager's handler (topology and device manager), so its allocatable for a device resource is
at least what the device manager has handed out (``UpdatePluginResources``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..kubeletmodel.quantity import parse_quantity
from ..kubeletmodel.views import ContainerSpec, PodSpecView
from .apiserver import is_extended_resource
from ..errors import AdmissionError
from .scheduler import pod_requests, tolerates

__all__ = ["pod_spec_view", "predicate_admit"]

_NAMED = ("cpu", "memory", "ephemeral-storage")


def _ext_limits(c: Mapping[str, Any]) -> dict[str, int]:
    limits = ((c.get("resources") or {}).get("limits")) or {}
    return {k: parse_quantity(v).ceil_int() for k, v in limits.items() if is_extended_resource(k)}


def pod_spec_view(pod: Mapping[str, Any]) -> PodSpecView:
    """The device manager's view of a pod: extended-resource limits, init containers first."""
    meta, spec = pod["metadata"], pod.get("spec") or {}
    containers = [
        ContainerSpec(c["name"], _ext_limits(c), init=True, sidecar=c.get("restartPolicy") == "Always")
        for c in spec.get("initContainers") or []
    ] + [ContainerSpec(c["name"], _ext_limits(c)) for c in spec.get("containers") or []]
    return PodSpecView(meta["uid"], meta["name"], meta["namespace"], tuple(containers))


def predicate_admit(
    pod: Mapping[str, Any],
    others: Sequence[Mapping[str, Any]],
    *,
    labels: Mapping[str, str],
    taints: Sequence[Mapping[str, Any]],
    allocatable: Mapping[str, int],
    allocated: Mapping[str, int],
) -> None:
    """``predicateAdmitHandler`` for ``pod`` beside the node's active pods ``others``: raises
    :class:`~pytest_devplug.errors.AdmissionError` with upstream's reason and message.

    ``allocatable`` is the node's (cpu in milli-units, memory in bytes); ``allocated``: resource -> devices the
    device manager holds for these pods, ``pod`` included."""
    spec = pod.get("spec") or {}
    for k, v in (spec.get("nodeSelector") or {}).items():
        if labels.get(k) != v:
            raise AdmissionError("NodeAffinity", "Predicate NodeAffinity failed")
    for taint in taints:
        if taint.get("effect") == "NoExecute" and not tolerates(spec.get("tolerations") or [], taint):
            raise AdmissionError("TaintToleration", "Predicate TaintToleration failed")
    alloc = dict(allocatable)
    for res, n in allocated.items():
        if alloc.get(res, 0) < n:
            alloc[res] = n
    want = {k: v for k, v in pod_requests(pod).items() if not is_extended_resource(k) or k in alloc}
    used: dict[str, int] = {"pods": len(others)}
    for other in others:
        for k, v in pod_requests(other).items():
            used[k] = used.get(k, 0) + v
    if len(others) + 1 > alloc.get("pods", 0):
        raise AdmissionError(
            "OutOfpods",
            f"Node didn't have enough resource: pods, requested: 1, used: {len(others)}, "
            f"capacity: {alloc.get('pods', 0)}",
        )
    for k in [n for n in _NAMED if n in want] + sorted(n for n in want if n not in (*_NAMED, "pods")):
        if want[k] > 0 and want[k] > alloc.get(k, 0) - used.get(k, 0):
            raise AdmissionError(
                f"OutOf{k}",
                f"Node didn't have enough resource: {k}, requested: {want[k]}, used: {used.get(k, 0)}, "
                f"capacity: {alloc.get(k, 0)}",
            )
