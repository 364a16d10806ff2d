"""Scheduler filters and FitError wording (pure: no kubelet)."""

from __future__ import annotations

from typing import Any

from pytest_devplug.sim.apiserver import admit_pod
from pytest_devplug.sim.scheduler import NodeView, pod_requests, schedule

from ._helpers import GPU, pod


def node(name: str, gpus: int = 1, used: int = 0, **kw: Any) -> NodeView:
    return NodeView(
        name,
        kw.pop("labels", {}),
        kw.pop("taints", []),
        kw.pop("unschedulable", False),
        {"cpu": 8000, "memory": 2**35, "pods": 110, GPU: gpus},
        {"pods": used, GPU: used},
    )


def p(**kw: Any) -> dict[str, Any]:
    return admit_pod(pod("x", kw.pop("gpus", 1), **kw))


def test_fits_and_prefers_the_least_allocated_node() -> None:
    assert schedule(p(), [node("a", 2, 1), node("b", 2, 0)]).node == "b"


def test_insufficient_with_victimless_preemption() -> None:
    r = schedule(p(), [node("n", 1, 1)])
    assert r.node is None
    assert r.message == (
        "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. preemption: 0/1 nodes are "
        "available: 1 No preemption victims found for incoming pod."
    )


def test_request_above_allocatable_is_unresolvable() -> None:
    r = schedule(p(gpus=2), [node("n", 1)])
    assert r.message == (
        "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. preemption: 0/1 nodes are "
        "available: 1 Preemption is not helpful for scheduling."
    )


def test_reasons_are_a_sorted_histogram_first_failing_filter_only() -> None:
    nodes = [
        node("a", 0, taints=[{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]),
        node("b", 1, 1),
        node("c", 1, 1),
        node("d", 1, labels={"zone": "x"}, unschedulable=True),
    ]
    r = schedule(p(nodeSelector={"zone": "y"}), nodes)
    assert r.message == (
        "0/4 nodes are available: 1 node(s) had untolerated taint(s), 1 node(s) were unschedulable, "
        "2 node(s) didn't match Pod's node affinity/selector. preemption: 0/4 nodes are available: "
        "4 Preemption is not helpful for scheduling."
    )


def test_tolerations() -> None:
    taint = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
    n = [node("a", 1, taints=[taint])]
    assert schedule(p(tolerations=[{"key": "dedicated", "operator": "Equal", "value": "gpu"}]), n).node == "a"
    assert schedule(p(tolerations=[{"operator": "Exists"}]), n).node == "a"
    assert schedule(p(tolerations=[{"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}]), n).node is None
    assert schedule(p(tolerations=[{"key": "dedicated", "value": "cpu"}]), n).node is None
    ne = [node("a", 1, taints=[{"key": "k", "effect": "NoExecute"}])]
    assert "untolerated taint(s)" in schedule(p(), ne).message
    pref = [node("a", 1, taints=[{"key": "k", "effect": "PreferNoSchedule"}])]
    assert schedule(p(), pref).node == "a"


def test_node_affinity_operators() -> None:
    n = [node("a", 1, labels={"zone": "x", "gen": "3"}), node("b", 1, labels={"zone": "y"})]

    def aff(*exprs: dict[str, Any]) -> dict[str, Any]:
        return {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": list(exprs)}]
                }
            }
        }

    assert schedule(p(affinity=aff({"key": "zone", "operator": "In", "values": ["y"]})), n).node == "b"
    assert schedule(p(affinity=aff({"key": "zone", "operator": "NotIn", "values": ["y"]})), n).node == "a"
    assert schedule(p(affinity=aff({"key": "gen", "operator": "Exists"})), n).node == "a"
    assert schedule(p(affinity=aff({"key": "gen", "operator": "DoesNotExist"})), n).node == "b"
    assert schedule(p(affinity=aff({"key": "gen", "operator": "Gt", "values": ["2"]})), n).node == "a"
    assert schedule(p(affinity=aff({"key": "gen", "operator": "Lt", "values": ["3"]})), n).node is None
    names = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["b"]}]}]
            }
        }
    }
    assert schedule(p(affinity=names), n).node == "b"


def test_no_nodes_and_preemption_policy_never() -> None:
    assert schedule(p(), []).message == "no nodes available to schedule pods"
    r = schedule(p(preemptionPolicy="Never"), [node("n", 0)])
    assert r.message.endswith("preemption: not eligible due to preemptionPolicy=Never.")


def test_pod_requests_count_init_and_sidecars() -> None:
    spec = pod(
        "x",
        1,
        init=[
            {"name": "i", "image": "x", "resources": {"limits": {GPU: 3}}},
            {"name": "s", "image": "x", "restartPolicy": "Always", "resources": {"limits": {GPU: 1}}},
        ],
    )
    assert pod_requests(admit_pod(spec))[GPU] == 3
    spec2 = pod(
        "x",
        2,
        init=[
            {"name": "s", "image": "x", "restartPolicy": "Always", "resources": {"limits": {GPU: 1}}},
            {"name": "i", "image": "x", "resources": {"limits": {GPU: 1}}},
        ],
    )
    assert pod_requests(admit_pod(spec2))[GPU] == 3  # sidecar 1 + app 2; init 1 + sidecar 1 = 2
