"""Multi-node kind (kind-config/multi-node.yaml): GPU pods land only on the GPU worker; too big a request stays Pending.

Its own cluster (``devplug-multi``), created once for this module and deleted afterwards (kept with
``--keep-cluster``), or the e2e run's shared cluster (``DEVPLUG_KIND_CLUSTER``, kind-config/e2e.yaml). The GPU
worker is labelled ``devplug.io/gpu=true`` and tainted ``nvidia.com/gpu=present:NoSchedule``; the plain workers
have neither. Expectations are counted from the cluster's nodes, so both layouts give the same verdicts. The
plugin advertises ``devplug.io/kind-gpu``, which nothing else on the shared cluster does, so the lanes of
``nox -s e2e`` may run meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from .kind_helpers import GPU_TAINT, KIND_RESOURCE, unavailable
from pytest_devplug import ClusterHandle, NodeSpec, PluginSpec
from pytest_devplug.backends.base import BackendOptions
from pytest_devplug.errors import BackendUnavailableError
from pytest_devplug.backends.kind import kind_backend
from pytest_devplug.handles import DEFAULT_IMAGE, PodHandle
from pytest_devplug.settings import default_plugin_argv
from pytest_devplug.waiting import wait_for

pytestmark = pytest.mark.kind

RES = KIND_RESOURCE
TOLERATION = {"key": GPU_TAINT, "operator": "Exists", "effect": "NoSchedule"}


@pytest.fixture(scope="module")
def multi(request: pytest.FixtureRequest) -> Iterator[tuple[ClusterHandle, str]]:
    opts = BackendOptions(
        timeout=90.0,
        cluster_name="devplug-multi",
        keep_cluster=bool(request.config.getoption("keep_cluster", default=False)),
    )
    backend = kind_backend(opts, config="multi-node.yaml")
    try:
        backend.start()
    except BackendUnavailableError as exc:
        unavailable(f"multi-node kind cluster: {exc}")
    try:
        cluster = ClusterHandle(backend, timeout=opts.timeout)
        node = cluster.ensure_node(NodeSpec("gpu"))
        spec = PluginSpec(resource_name=RES, argv=tuple(default_plugin_argv(RES)), mock=True, gpus=4, numa_nodes=2)
        plugin = cluster.deploy(node, spec)
        plugin.wait_ready(4, timeout=180)
        yield cluster, node.name
    finally:
        backend.close()


def _pod(cluster: ClusterHandle, name: str, *, gpus: int | None, tolerate: bool) -> PodHandle:
    res: dict[str, Any] = {"limits": {RES: str(gpus)}} if gpus else {}
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": DEFAULT_IMAGE, "command": ["sleep", "3600"], "resources": res}],
        "terminationGracePeriodSeconds": 1,
    }
    if tolerate:
        spec["tolerations"] = [TOLERATION]
    ns = cluster.backend.pod_namespace
    cluster.backend.create_pod(
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns}, "spec": spec}
    )
    return PodHandle(cluster.backend, name, ns, container="main", resource_name=RES, timeout=cluster.timeout)


def _tainted(cluster: ClusterHandle) -> int:
    """Nodes a pod without tolerations cannot go to (the control plane, the GPU worker)."""
    return sum(
        any(t.get("effect") == "NoSchedule" for t in n.get("spec", {}).get("taints") or [])
        for n in cluster.backend.list_nodes()
    )


def _available(total: int, reasons: dict[str, int]) -> str:
    """The scheduler's ``0/N nodes are available: ...`` with its reasons sorted as strings (upstream's FitError)."""
    return f"0/{total} nodes are available: " + ", ".join(sorted(f"{n} {r}" for r, n in reasons.items() if n))


def test_only_the_gpu_worker_advertises_gpus(multi: tuple[ClusterHandle, str]) -> None:
    cluster, gpu_node = multi
    counts = {n.name: n.counts(RES) for n in cluster.nodes}
    assert counts.pop(gpu_node) == (4, 4)
    assert len(counts) >= 2 and all(c in ((None, None), (0, 0)) for c in counts.values()), counts


def test_gpu_pod_lands_on_the_gpu_worker(multi: tuple[ClusterHandle, str]) -> None:
    cluster, gpu_node = multi
    pod = _pod(cluster, "mn-gpu", gpus=1, tolerate=True)
    try:
        pod.wait_running()
        assert pod.node_name == gpu_node
        assert len(pod.allocated_devices) == 1
    finally:
        pod.delete()


def test_plain_pod_stays_off_the_gpu_worker(multi: tuple[ClusterHandle, str]) -> None:
    """No toleration: the taint keeps it off the GPU node; it runs on the plain worker."""
    cluster, gpu_node = multi
    pod = _pod(cluster, "mn-plain", gpus=None, tolerate=False)
    try:
        pod.wait_running()
        assert pod.node_name not in (gpu_node, None) and not pod.node_name.endswith("control-plane"), pod.node_name
    finally:
        pod.delete()


def test_gpu_pod_without_toleration_is_unschedulable(multi: tuple[ClusterHandle, str]) -> None:
    cluster, _ = multi
    pod = _pod(cluster, "mn-untolerated", gpus=1, tolerate=False)
    try:
        msg = pod.wait_event("FailedScheduling: ")
        assert pod.phase == "Pending" and pod.node_name is None
        # Kubernetes 1.34: control plane + GPU worker tainted, the plain workers have no GPUs.
        total, tainted = len(cluster.backend.list_nodes()), _tainted(cluster)
        reasons = {f"Insufficient {RES}": total - tainted, "node(s) had untolerated taint(s)": tainted}
        assert msg.startswith(
            f"FailedScheduling: {_available(total, reasons)}. preemption: "
            f"{_available(total, {'Preemption is not helpful for scheduling.': total})}"
        ), msg
    finally:
        pod.delete()


def test_more_gpus_than_any_node_stays_pending(multi: tuple[ClusterHandle, str]) -> None:
    cluster, _ = multi
    pod = _pod(cluster, "mn-too-many", gpus=5, tolerate=True)
    try:
        msg = pod.wait_event(f"FailedScheduling: .*Insufficient {RES}")
        assert pod.phase == "Pending" and pod.node_name is None, (pod.phase, pod.node_name)
        # kube-scheduler records the event and patches the pod's status separately: the event may be seen first
        cond = wait_for(
            lambda: next((c for c in pod.conditions if c.get("type") == "PodScheduled"), {}),
            lambda c: c.get("status") == "False",
            timeout=30.0,
            interval=0.5,
            what=f"pod {pod.name}'s PodScheduled=False condition after its FailedScheduling event",
        )
        assert (cond.get("status"), cond.get("reason")) == ("False", "Unschedulable"), cond
        assert msg.startswith(f"FailedScheduling: 0/{len(cluster.backend.list_nodes())} nodes are available: "), msg
    finally:
        pod.delete()
