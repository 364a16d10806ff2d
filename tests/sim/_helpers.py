"""Helpers of the control-plane tests: mock-NVML state files, the real GPU plugin's command line,
pod manifests and bounded waits that say what they expected and what they saw."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, TypeVar

from pytest_devplug.backends.base import PluginSpec
from pytest_devplug.nvml import mock_env
from pytest_devplug.settings import default_plugin_argv

from ..support import RESOURCE, WAIT, wait_until

GPU = RESOURCE
T = TypeVar("T")


def gpu(i: int, numa: int | None = 0, **extra: Any) -> dict[str, Any]:
    return {
        "uuid": f"GPU-{i:04d}",
        "name": "NVIDIA A100-SXM4-40GB",
        "memory_mib": 40960,
        "numa_node": numa,
        "minor": i,
        "lost": False,
        "fail_allocate": False,
        **extra,
    }


def write_state(path: Path, gpus: list[dict[str, Any]], events: list[dict[str, Any]] | None = None) -> None:
    """Replace the mock NVML state atomically (the plugin watches the file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"gpus": gpus, "events": events or []}))
    os.replace(tmp, path)


def plugin_argv(plugin_dir: Path, state: Path, *extra: str, resource: str = GPU) -> list[str]:
    """The included GPU plugin's command line as the harness starts it on a node, plus ``extra`` flags."""
    spec = PluginSpec(argv=default_plugin_argv(resource, pre_start_required=False))
    return [*spec.command(plugin_dir=plugin_dir, mock_state=state)[0], *extra]


def pod(
    name: str,
    gpus: int | str | None = 1,
    *,
    requests: Any = None,
    node_name: str | None = None,
    restart_policy: str | None = None,
    init: list[dict[str, Any]] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    res: dict[str, Any] = {}
    if gpus is not None:
        res["limits"] = {GPU: gpus}
    if requests is not None:
        res["requests"] = {GPU: requests}
    body: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox", "resources": res}], **spec}
    if node_name:
        body["nodeName"] = node_name
    if restart_policy:
        body["restartPolicy"] = restart_policy
    if init:
        body["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": body}


def wait_for(fn: Callable[[], T], ok: Callable[[T], bool], what: str, timeout: float = WAIT) -> T:
    """:func:`tests.support.wait_until` in this folder's historical argument order (probe, ok, what)."""
    __tracebackhide__ = True
    return wait_until(what, fn, ok, timeout=timeout)


def allocatable(cluster: Any, node: str, resource: str = GPU) -> tuple[str | None, str | None]:
    st = cluster.get_node(node)["status"]
    return st["capacity"].get(resource), st["allocatable"].get(resource)


def start_gpu_node(cluster: Any, name: str, state: Path, n: int = 2, *extra: str, **node_kw: Any) -> Any:
    """Add a node, run the real GPU plugin on ``n`` mock GPUs and wait until they are allocatable."""
    if not state.exists():
        write_state(state, [gpu(i, numa=i % 2) for i in range(n)])
    node = cluster.add_node(name, **node_kw)
    node.start_plugin(plugin_argv(node.plugin_dir, state, *extra), env=mock_env(str(state)))
    wait_for(lambda: allocatable(cluster, name), lambda v: v == (str(n), str(n)), f"{n}/{n} {GPU} on {name}")
    return node


def pod_resources(node: Any) -> dict[tuple[str, str], dict[str, list[str]]]:
    """``List`` of the node's pod-resources API: {(pod, container): {resource: device ids}}."""
    import grpc

    from pytest_devplug.api.podresources import v1_pb2, v1_pb2_grpc

    with grpc.insecure_channel(f"unix://{node.pod_resources_socket}") as ch:
        stub = v1_pb2_grpc.PodResourcesListerStub(ch)  # type: ignore[no-untyped-call]
        resp = stub.List(v1_pb2.ListPodResourcesRequest(), timeout=5)
    out: dict[tuple[str, str], dict[str, list[str]]] = {}
    for p in resp.pod_resources:
        for c in p.containers:
            out[(p.name, c.name)] = {d.resource_name: sorted(d.device_ids) for d in c.devices}
    return out


def phase(cluster: Any, name: str) -> str:
    return str(cluster.get_pod(name)["status"].get("phase"))
