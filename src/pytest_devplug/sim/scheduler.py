"""The default scheduler's filter phase for what device-plugin tests exercise.

Filters run per node in the default profile's order and stop at the first failure, as
``RunFilterPlugins`` does: NodeUnschedulable, TaintToleration, NodeAffinity (nodeSelector and
required affinity), NodeResourcesFit. A pod that fits nowhere gets upstream's ``FitError`` text:
a sorted histogram of reasons, then DefaultPreemption's verdict (no priorities are simulated, so
preemption never finds victims), e.g. ``0/1 nodes are available: 1 Insufficient nvidia.com/gpu.
no new claims to deallocate, preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod.``
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from ..kubeletmodel.quantity import parse_quantity
from ..kubeletmodel.releases import KubeVersion

__all__ = [
    "NodeView",
    "FilterStatus",
    "pod_requests",
    "filter_node",
    "fit_error_message",
    "schedule",
    "ScheduleResult",
    "tolerates",
]

UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
NO_NODES_MSG = "no nodes available to schedule pods"


@dataclass
class NodeView:
    """What the scheduler's cache knows of a node."""

    name: str
    labels: dict[str, str]
    taints: list[dict[str, Any]]
    unschedulable: bool
    allocatable: dict[str, int]  # cpu in milli-units, memory in bytes, pods and extended as counts
    #: Summed requests of the non-terminated pods bound (or assumed) to the node, incl. "pods".
    requested: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class FilterStatus:
    """A failed filter: its reasons, and whether preemption could help (``Unschedulable``) or not
    (``UnschedulableAndUnresolvable``)."""

    reasons: tuple[str, ...]
    unresolvable: bool


def _amount(name: str, raw: object) -> int:
    q = parse_quantity(raw)
    return q.milli() if name == "cpu" else q.ceil_int()


def pod_requests(pod: Mapping[str, Any]) -> dict[str, int]:
    """Effective requests of a pod: max(sum of app containers + sidecars, each init container
    with the sidecars started before it), per resource, as ``resourcehelper.PodRequests``."""
    spec = pod.get("spec") or {}

    def req(c: Mapping[str, Any]) -> dict[str, int]:
        raw = ((c.get("resources") or {}).get("requests")) or {}
        return {k: _amount(k, v) for k, v in raw.items()}

    total: dict[str, int] = {}
    for c in spec.get("containers") or []:
        for k, v in req(c).items():
            total[k] = total.get(k, 0) + v
    sidecars: dict[str, int] = {}
    init_max: dict[str, int] = {}
    for c in spec.get("initContainers") or []:
        r = req(c)
        if c.get("restartPolicy") == "Always":
            for k, v in r.items():
                sidecars[k] = sidecars.get(k, 0) + v
                total[k] = total.get(k, 0) + v
            candidate = sidecars
        else:
            candidate = {k: r.get(k, 0) + sidecars.get(k, 0) for k in set(r) | set(sidecars)}
        for k, v in candidate.items():
            init_max[k] = max(init_max.get(k, 0), v)
    for k, v in init_max.items():
        total[k] = max(total.get(k, 0), v)
    return total


def tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """``Toleration.ToleratesTaint`` for any of ``tolerations``."""
    for t in tolerations:
        effect = t.get("effect") or ""
        if effect and effect != taint.get("effect"):
            continue
        key = t.get("key") or ""
        if key and key != taint.get("key"):
            continue
        op = t.get("operator") or "Equal"
        if op == "Exists" or (op == "Equal" and (t.get("value") or "") == (taint.get("value") or "")):
            return True
    return False


def _match_expression(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, op, values = expr.get("key", ""), expr.get("operator", ""), list(expr.get("values") or [])
    present = key in labels
    if op == "In":
        return present and labels[key] in values
    if op == "NotIn":
        return not present or labels[key] not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt"):
        if not present or len(values) != 1:
            return False
        try:
            have, want = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False


def _match_term(term: Mapping[str, Any], node: NodeView) -> bool:
    exprs = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not exprs and not fields:
        return False  # an empty term matches no objects
    if not all(_match_expression(e, node.labels) for e in exprs):
        return False
    return all(_match_expression(f, {"metadata.name": node.name}) for f in fields)


def _affinity_matches(pod: Mapping[str, Any], node: NodeView) -> bool:
    spec = pod.get("spec") or {}
    for k, v in (spec.get("nodeSelector") or {}).items():
        if node.labels.get(k) != v:
            return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if required:
        return any(_match_term(t, node) for t in required.get("nodeSelectorTerms") or [])
    return True


def filter_node(
    pod: Mapping[str, Any], node: NodeView, requests: Mapping[str, int] | None = None
) -> FilterStatus | None:
    """Run the filters in order; ``None`` when the pod fits the node."""
    spec = pod.get("spec") or {}
    tolerations = spec.get("tolerations") or []
    if node.unschedulable and not tolerates(tolerations, {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}):
        return FilterStatus(("node(s) were unschedulable",), True)
    for taint in node.taints:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tolerations, taint):
            # Kubernetes >= 1.34 no longer names the taint (seen on a real 1.34 kind cluster).
            return FilterStatus(("node(s) had untolerated taint(s)",), True)
    if not _affinity_matches(pod, node):
        return FilterStatus(("node(s) didn't match Pod's node affinity/selector",), True)
    req = pod_requests(pod) if requests is None else requests
    reasons: list[str] = []
    unresolvable = False
    if node.requested.get("pods", 0) + 1 > node.allocatable.get("pods", 0):
        reasons.append("Too many pods")
    names = [n for n in ("cpu", "memory", "ephemeral-storage") if n in req] + sorted(
        n for n in req if n not in ("cpu", "memory", "ephemeral-storage", "pods")
    )
    for name in names:
        want = req[name]
        if want <= 0:
            continue
        alloc = node.allocatable.get(name, 0)
        if want > alloc - node.requested.get(name, 0):
            reasons.append(f"Insufficient {name}")
            unresolvable = unresolvable or want > alloc
    if reasons:
        return FilterStatus(tuple(reasons), unresolvable)
    return None


def _histogram(reasons: Iterable[str]) -> str:
    counts: dict[str, int] = {}
    for r in reasons:
        counts[r] = counts.get(r, 0) + 1
    return ", ".join(sorted(f"{n} {r}" for r, n in counts.items()))


def fit_error_message(
    pod: Mapping[str, Any], statuses: Mapping[str, FilterStatus], num_nodes: int, kube: KubeVersion | None = None
) -> str:
    """``FitError.Error()`` followed by DefaultPreemption's PostFilter message."""
    if num_nodes == 0:
        return NO_NODES_MSG
    msg = f"0/{num_nodes} nodes are available: {_histogram(r for s in statuses.values() for r in s.reasons)}."
    if (pod.get("spec") or {}).get("preemptionPolicy") == "Never":
        post = "not eligible due to preemptionPolicy=Never."
    else:
        post = (
            f"0/{num_nodes} nodes are available: "
            + _histogram(
                "Preemption is not helpful for scheduling"
                if s.unresolvable
                else "No preemption victims found for incoming pod"
                for s in statuses.values()
            )
            + "."
        )
    # DynamicResources' PostFilter runs first (DRA is on by default since 1.34): before 1.37 its note on a pod
    # without claims precedes preemption's; from 1.37 it says nothing.
    if (kube or KubeVersion.of()).has("scheduler-dra-postfilter-silent"):
        return f"{msg} preemption: {post}"
    return f"{msg} no new claims to deallocate, preemption: {post}"


@dataclass(frozen=True)
class ScheduleResult:
    node: str | None
    message: str  # the FitError text when ``node`` is None


def schedule(pod: Mapping[str, Any], nodes: Sequence[NodeView], kube: KubeVersion | None = None) -> ScheduleResult:
    """Pick a node for ``pod``: among the feasible ones, the least allocated on the pod's extended
    resources (then by name), a simple stand-in for the scoring plugins."""
    if not nodes:
        return ScheduleResult(None, NO_NODES_MSG)
    req = pod_requests(pod)
    statuses: dict[str, FilterStatus] = {}
    feasible: list[NodeView] = []
    for node in nodes:
        st = filter_node(pod, node, req)
        if st is None:
            feasible.append(node)
        else:
            statuses[node.name] = st
    if not feasible:
        return ScheduleResult(None, fit_error_message(pod, statuses, len(nodes), kube))
    ext = [k for k in req if "/" in k]

    def free(n: NodeView) -> tuple[int, str]:
        return (-sum(n.allocatable.get(k, 0) - n.requested.get(k, 0) for k in ext), n.name)

    return ScheduleResult(min(feasible, key=free).name, "")
