"""Smoke test of the kind tier: a real cluster starts, an image built here loads into it, and the
included GPU plugin's DaemonSet advertises the mock GPUs (as ``devplug.io/kind-gpu``) on the GPU node.

Run by ``nox -s e2e`` (``pytest -m kind tests/kind``); ``--keep-cluster`` keeps the cluster afterwards.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from .kind_helpers import GPU_TAINT, KIND_RESOURCE, REPO, KindCluster, python_base_image, run, unavailable, wait_for

from pytest_devplug.backends.k8s.manifests import mock_library_file
from pytest_devplug.backends.kind.deploy import PluginImage
from pytest_devplug.errors import DevplugError

pytestmark = pytest.mark.kind

PLUGIN_DIR = REPO / "plugin_under_test"
RESOURCE = KIND_RESOURCE
MOCK_STATE = "/var/lib/devplug/mock-state.json"
GPU_LABEL = "devplug.io/gpu=true"


def test_nodes_ready(kind_cluster: KindCluster) -> None:
    def all_ready() -> list[Any] | None:
        items = kind_cluster.kubectl_json("get", "nodes")["items"]
        ok = len(items) == len(kind_cluster.nodes) and all(
            any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"]) for n in items
        )
        return items if ok else None

    nodes = wait_for("every node Ready", all_ready, timeout=180)
    gpu_nodes = [n for n in nodes if n["metadata"].get("labels", {}).get("devplug.io/gpu") == "true"]
    assert gpu_nodes, "no node labelled devplug.io/gpu=true"
    if len(nodes) > 1:  # multi-node.yaml: the GPU worker carries the nvidia.com/gpu taint
        taints = [t for n in gpu_nodes for t in n["spec"].get("taints", [])]
        assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in taints, taints


def test_loaded_image_runs_a_pod(kind_cluster: KindCluster) -> None:
    """`kind load docker-image` works and a pod runs from the loaded image (pulling nothing)."""
    image = python_base_image()
    if image is None:
        image = "busybox:1.36"  # users' machines: pullable
        run(["docker", "pull", image], timeout=300)
        command = ["sh", "-c", "echo devplug-smoke-ok"]
    else:
        command = ["python3", "-c", "print('devplug-smoke-ok')"]
    kind_cluster.load_image(image)
    name = f"smoke-{uuid.uuid4().hex[:6]}"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "restartPolicy": "Never",
            "tolerations": [{"key": GPU_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "c", "image": image, "imagePullPolicy": "Never", "command": command}],
        },
    }
    kind_cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))
    try:
        phase = wait_for(
            f"pod {name} to finish",
            lambda: (
                p
                if (p := kind_cluster.kubectl_json("get", "pod", name)["status"].get("phase"))
                in ("Succeeded", "Failed")
                else None
            ),
            timeout=180,
        )
        logs = kind_cluster.kubectl("logs", name).stdout
        assert phase == "Succeeded" and "devplug-smoke-ok" in logs, (
            phase,
            logs,
            kind_cluster.kubectl("describe", "pod", name).stdout,
        )
    finally:
        kind_cluster.kubectl("delete", "pod", name, "--wait=false", check=False)


def _mock_state(n: int) -> str:
    gpus = [
        {
            "uuid": f"GPU-{i:08d}-0000-0000-0000-000000000000",
            "name": "NVIDIA A100-SXM4-40GB",
            "memory_mib": 40960,
            "numa_node": i % 2,
            "minor": i,
            "lost": False,
            "fail_allocate": False,
        }
        for i in range(n)
    ]
    return json.dumps({"gpus": gpus, "events": []})


def _plugin_manifest(image: str) -> str:
    """The plugin's DaemonSet manifest with its container images pointed at the image loaded here, advertising
    the kind tier's own resource (see ``KIND_RESOURCE``)."""
    docs = [d for d in yaml.safe_load_all((PLUGIN_DIR / "deploy" / "daemonset.yaml").read_text()) if d]
    for d in docs:
        spec = d.get("spec", {}).get("template", {}).get("spec", {})
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            c["image"] = image
            c["imagePullPolicy"] = "IfNotPresent"
            env = [e for e in c.get("env", []) if e.get("name") != "DP_RESOURCE_NAME"]
            c["env"] = [*env, {"name": "DP_RESOURCE_NAME", "value": RESOURCE}]
    return str(yaml.safe_dump_all(docs))


def test_plugin_advertises_mock_gpus(kind_cluster: KindCluster, tmp_path: Path) -> None:
    """The included plugin's image (the kind backend's recipe, cached by its inputs: built once for the e2e run),
    loaded into the cluster, its own DaemonSet applied as a user would: the GPU worker advertises the mock GPUs."""
    t0 = time.monotonic()
    try:
        image = PluginImage(tmp_path).included()
    except DevplugError as exc:
        unavailable(f"the included plugin's image cannot be built: {exc}")
        raise
    print(f"\nplugin image {image} in {time.monotonic() - t0:.1f}s")
    node = kind_cluster.node_container(GPU_LABEL)
    kind_cluster.load_image(image, node)
    n_gpus = int(os.environ.get("DEVPLUG_KIND_GPUS", "4"))
    kind_cluster.write_node_file(node, MOCK_STATE, _mock_state(n_gpus))
    # The included plugin's --nvml mock loads the harness's mock libnvidia-ml.so.1 from the node (the
    # DaemonSet's hostPath and LD_LIBRARY_PATH), as the kind backend hands it over.
    lib_path, lib_bytes = mock_library_file()
    local_lib = tmp_path / os.path.basename(lib_path)
    local_lib.write_bytes(lib_bytes)
    run(["docker", "exec", node, "mkdir", "-p", os.path.dirname(lib_path)])
    run(["docker", "cp", str(local_lib), f"{node}:{lib_path}"])
    manifest = _plugin_manifest(image)
    kind_cluster.kubectl("apply", "-f", "-", input=manifest)
    try:
        _check_advertised(kind_cluster, node, n_gpus)
    finally:
        # A cluster the e2e run shares: the next user of this node must not find this plugin on it.
        kind_cluster.kubectl("delete", "-f", "-", "--wait=true", input=manifest, check=False, timeout=300)


def _check_advertised(kind_cluster: KindCluster, node: str, n_gpus: int) -> None:
    def advertised() -> tuple[str, str] | None:
        status = kind_cluster.kubectl_json("get", "node", node)["status"]
        cap, alloc = status.get("capacity", {}).get(RESOURCE), status.get("allocatable", {}).get(RESOURCE)
        return (cap, alloc) if cap == str(n_gpus) and alloc == str(n_gpus) else None

    try:
        wait_for(f"{RESOURCE}={n_gpus} in capacity and allocatable of {node}", advertised, timeout=240)
    except AssertionError as e:
        pods = kind_cluster.kubectl("get", "pods", "-A", "-o", "wide", check=False).stdout
        logs = kind_cluster.kubectl(
            "logs",
            "-n",
            "kube-system",
            "-l",
            "app.kubernetes.io/name=devplug-gpu-plugin",
            "--tail=50",
            "--all-containers",
            check=False,
        )
        raise AssertionError(f"{e}\n--- pods\n{pods}\n--- logs\n{logs.stdout}{logs.stderr}") from None
    # the other nodes (multi-node config) must not advertise GPUs
    for other in kind_cluster.nodes:
        if other != node:
            cap = kind_cluster.kubectl_json("get", "node", other)["status"].get("capacity", {})
            assert RESOURCE not in cap or cap[RESOURCE] == "0", (other, cap)
