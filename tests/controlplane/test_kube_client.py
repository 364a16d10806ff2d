"""What the harness sends the API server, with whichever release of the ``kubernetes`` client is installed.

The extras allow 30 and later, and the releases differ where it hurts: up to 36 there is no ``_content_type`` and no
``param_serialize``; 37 turns a dict body into the operation's model before sending it, so a whole-second MicroTime
goes out as ``...05+00:00`` (the API server answers 400) and an integer quantity is refused before the API server
sees it. ``nox -s tests`` runs this with the newest client, ``nox -s tests_lowest`` at the floors (the harness's
own, then the included driver's ``dra`` extra): one control plane, each kind of request the embedded kubelets
(``RealPlane``), the DRA side (``KubeRest``) and the kube backend (``KubeApi``) make.
"""

from __future__ import annotations

import datetime
import logging
from pathlib import Path

import kubernetes
import pytest

from pytest_devplug.backends.k8s.api import KubeApi
from pytest_devplug.controlplane import ControlPlane
from pytest_devplug.dra.objects import device_class_manifest, list_slices
from pytest_devplug.kuberest import KubeRest
from pytest_devplug.errors import BackendUnavailableError, RestError
from pytest_devplug.sim import realplane
from pytest_devplug.sim.realplane import RealPlane
from pytest_devplug.sim.dra.apiseams import RESOURCE_API, KubeletDRAApi

from ..sim._helpers import GPU, phase, pod, start_gpu_node, wait_for
from ..support import control_plane_binaries

LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"


def _slice(node: str) -> dict[str, object]:
    spec = {
        "driver": "compat.devplug.example",
        "nodeName": node,
        "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
        "devices": [{"name": "d0"}],
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-compat"},
        "spec": spec,
    }


def test_every_kind_of_request_at_this_client_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A whole second: the MicroTime a client that re-serialises through its models would send as "+00:00".
    renew = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    monkeypatch.setattr(realplane, "_micro_now", lambda: renew)
    caplog.set_level(logging.WARNING, logger=realplane.__name__)
    print(f"kubernetes client {kubernetes.__version__}")
    with ControlPlane(control_plane_binaries()) as cp:
        client = cp.client()
        rest = KubeRest(client, 20)
        try:
            with RealPlane(client, timeout=20) as cluster:
                # The kubelet's side: Node created, status posted (strategic merge), Lease created, then patched.
                start_gpu_node(cluster, "node-1", tmp_path / "state.json", 2)
                lease = rest.get(f"{LEASES}/node-1")["spec"]
                assert (lease["holderIdentity"], lease["renewTime"]) == ("node-1", renew)
                labels = cluster.update_node("node-1", labels={"pool": "a"})["metadata"]["labels"]  # a merge patch
                assert labels.get("pool") == "a" and "kubernetes.io/hostname" not in labels, labels
                # A pod as written (an integer quantity: the API server judges it), its status posted by the node.
                created = cluster.create_pod(pod("p", 1))
                assert created["spec"]["containers"][0]["resources"]["limits"] == {GPU: "1"}
                wait_for(lambda: phase(cluster, "p"), lambda v: v == "Running", "pod p running")
                for _ in range(2):  # a repeated event: created, then its count patched
                    cluster.record_event("node-1", created, "Normal", "Compat", "seen twice")
                counts = [
                    e.get("count")
                    for e in cluster.events(namespace="default", involved_name="p")
                    if e["reason"] == "Compat"
                ]
                assert counts == [2], counts

                # The DRA side: resource.k8s.io/v1 by path, whatever API classes the client has.
                rest.create(f"{RESOURCE_API}/deviceclasses", device_class_manifest("compat", "compat.devplug.example"))
                rest.create(f"{RESOURCE_API}/resourceslices", _slice("node-1"))
                assert [s.devices for s in list_slices(rest, node="node-1")] == [("d0",)]
                kubelet_api = KubeletDRAApi(rest)
                kubelet_api.delete_resource_slices("node-1", "compat.devplug.example")
                assert list_slices(rest, node="node-1") == []
                with pytest.raises(RestError, match='resourceclaims.resource.k8s.io "nope" not found') as missing:
                    kubelet_api.get_resource_claim("default", "nope")
                assert missing.value.not_found

                # The kube backend's API calls: a pod as written there too (bound to no node of ours: it stays Pending).
                kube = KubeApi(client, 20)
                q = kube.create_pod(pod("q", 1, node_name="elsewhere"))
                assert q["spec"]["containers"][0]["resources"]["limits"] == {GPU: "1"}
                kube.delete_pod("q", "default", grace=0)
            with pytest.raises(RestError) as gone:
                rest.get(f"{LEASES}/node-1")
            assert gone.value.not_found, "close() removes the node's Lease"
            rest.delete(f"{RESOURCE_API}/deviceclasses/compat")
        finally:
            client.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [], f"the embedded kubelets' requests failed (logged only): {warnings}"


def test_listing_pods_of_a_cluster_gone_is_a_backend_error() -> None:
    """A kind session that deleted its cluster still has the report's look after the last check: listing pods must
    raise the harness's error (which the report expects), not urllib3's (pytest's INTERNALERROR)."""
    config = kubernetes.client.Configuration()
    config.host = "https://127.0.0.1:9"  # the discard port: nothing listens
    config.retries = False
    api = KubeApi(kubernetes.client.ApiClient(config), timeout=2)
    try:
        with pytest.raises(BackendUnavailableError, match=r"listing pods: https://127\.0\.0\.1:9 does not answer"):
            api.list_pods("default")
    finally:
        api.close()
