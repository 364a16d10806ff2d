"""Smoke test of the kind tier: a real cluster starts, an image built here loads into it, and the
included GPU plugin's DaemonSet advertises the mock GPUs as ``nvidia.com/gpu`` on the GPU node.

Run by ``nox -s e2e`` (``pytest -m kind tests/kind``); ``--keep-cluster`` keeps the cluster afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from .kind_helpers import REPO, KindCluster, python_base_image, run, unavailable, wait_for

from pytest_devplug.backends.k8s.manifests import mock_library_file

from ..support import RESOURCE

pytestmark = pytest.mark.kind

PLUGIN_DIR = REPO / "plugin_under_test"
PLUGIN_IMAGE = "devplug/gpu-plugin:kind-smoke"
MOCK_STATE = "/var/lib/devplug/mock-state.json"
GPU_LABEL = "devplug.io/gpu=true"




def test_nodes_ready(kind_cluster: KindCluster) -> None:
    def all_ready() -> list[Any] | None:
        items = kind_cluster.kubectl_json("get", "nodes")["items"]
        ok = len(items) == len(kind_cluster.nodes) and all(
            any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"]) for n in items)
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
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
        "spec": {"restartPolicy": "Never",
                 "tolerations": [{"key": RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
                 "containers": [{"name": "c", "image": image, "imagePullPolicy": "Never", "command": command}]},
    }
    kind_cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))
    try:
        phase = wait_for(f"pod {name} to finish", lambda: (
            p if (p := kind_cluster.kubectl_json("get", "pod", name)["status"].get("phase")) in ("Succeeded", "Failed")
            else None), timeout=180)
        logs = kind_cluster.kubectl("logs", name).stdout
        assert phase == "Succeeded" and "devplug-smoke-ok" in logs, (phase, logs,
                                                                     kind_cluster.kubectl("describe", "pod", name).stdout)
    finally:
        kind_cluster.kubectl("delete", "pod", name, "--wait=false", check=False)


def _mock_state(n: int) -> str:
    gpus = [{"uuid": f"GPU-{i:08d}-0000-0000-0000-000000000000", "name": "NVIDIA A100-SXM4-40GB",
             "memory_mib": 40960, "numa_node": i % 2, "minor": i, "lost": False, "fail_allocate": False}
            for i in range(n)]
    return json.dumps({"gpus": gpus, "events": []})


def _plugin_manifest(image: str) -> str:
    """The plugin's DaemonSet manifest with its container images pointed at the image loaded here."""
    docs = [d for d in yaml.safe_load_all((PLUGIN_DIR / "deploy" / "daemonset.yaml").read_text()) if d]
    for d in docs:
        spec = d.get("spec", {}).get("template", {}).get("spec", {})
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            c["image"] = image
            c["imagePullPolicy"] = "IfNotPresent"
    return str(yaml.safe_dump_all(docs))


def _image_python(image: str) -> str:
    out = run(["docker", "run", "--rm", "--entrypoint", "python3", image, "-c",
               "import sys; print('%d.%d' % sys.version_info[:2])"], timeout=300).stdout
    return out.strip().splitlines()[-1]


def _pip() -> list[str]:
    """A pip to run: this interpreter's, else the system python3's (uv-made venvs have no pip)."""
    candidates = (sys.executable, getattr(sys, "_base_executable", None), shutil.which("python3"), "/usr/bin/python3")
    for python in candidates:
        if python and run([python, "-m", "pip", "--version"], check=False).returncode == 0:
            return [python, "-m", "pip"]
    unavailable("no pip to fetch the plugin's wheels with")
    raise AssertionError("unreachable")


def build_plugin_image(tmp: Path, tag: str) -> None:
    """Build plugin_under_test/Dockerfile in a copy of the directory, with dist/ holding the plugin's
    wheel and every dependency wheel for the base image's Python (downloaded here, on the host: a
    container on the CI machines cannot verify PyPI's TLS chain, and nothing there needs PyPI)."""
    ctx = tmp / "plugin-context"
    shutil.copytree(PLUGIN_DIR, ctx, ignore=shutil.ignore_patterns("dist", "build", "*.egg-info", "__pycache__"))
    dist = ctx / "dist"
    base = python_base_image()
    pyver = _image_python(base or "python:3.12-slim")
    pip = _pip()
    run([*pip, "wheel", "--no-deps", "-q", "-w", str(dist), str(ctx)], timeout=600)
    wheel = next(dist.glob("devplug_gpu_plugin-*.whl"))
    platforms = [f"--platform={p}" for p in ("manylinux_2_34_x86_64", "manylinux_2_28_x86_64",
                                               "manylinux_2_17_x86_64", "manylinux2014_x86_64", "linux_x86_64")]
    run([*pip, "download", "-q", "-d", str(dist), "--only-binary=:all:",
         f"--python-version={pyver}", "--implementation=cp", *platforms, str(wheel)], timeout=900)
    build = ["docker", "build", "-q", "-t", tag]
    if base is not None:
        build += ["--build-arg", f"BASE_IMAGE={base}"]
    proc = run([*build, str(ctx)], check=False, timeout=1200)
    if proc.returncode != 0:
        unavailable(f"plugin image build failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def test_plugin_advertises_mock_gpus(kind_cluster: KindCluster, tmp_path: Path) -> None:
    dockerfile = PLUGIN_DIR / "Dockerfile"
    manifest = PLUGIN_DIR / "deploy" / "daemonset.yaml"
    if not dockerfile.exists() or not manifest.exists():
        pytest.skip("plugin_under_test/Dockerfile or deploy/daemonset.yaml not there yet")
    t0 = time.monotonic()
    build_plugin_image(tmp_path, PLUGIN_IMAGE)
    print(f"\nplugin image built in {time.monotonic() - t0:.1f}s")
    kind_cluster.load_image(PLUGIN_IMAGE)

    node = kind_cluster.node_container(GPU_LABEL)
    n_gpus = int(os.environ.get("DEVPLUG_KIND_GPUS", "4"))
    kind_cluster.write_node_file(node, MOCK_STATE, _mock_state(n_gpus))
    # The included plugin's --nvml mock loads the harness's mock libnvidia-ml.so.1 from the node (the
    # DaemonSet's hostPath and LD_LIBRARY_PATH), as the kind backend hands it over.
    lib_path, lib_bytes = mock_library_file()
    local_lib = tmp_path / os.path.basename(lib_path)
    local_lib.write_bytes(lib_bytes)
    run(["docker", "exec", node, "mkdir", "-p", os.path.dirname(lib_path)])
    run(["docker", "cp", str(local_lib), f"{node}:{lib_path}"])
    manifest = _plugin_manifest(PLUGIN_IMAGE)
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
        logs = kind_cluster.kubectl("logs", "-n", "kube-system", "-l", "app.kubernetes.io/name=devplug-gpu-plugin",
                                   "--tail=50", "--all-containers", check=False)
        raise AssertionError(f"{e}\n--- pods\n{pods}\n--- logs\n{logs.stdout}{logs.stderr}") from None
    # the other nodes (multi-node config) must not advertise GPUs
    for other in kind_cluster.nodes:
        if other != node:
            cap = kind_cluster.kubectl_json("get", "node", other)["status"].get("capacity", {})
            assert RESOURCE not in cap or cap[RESOURCE] == "0", (other, cap)
