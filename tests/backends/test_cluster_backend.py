"""Units of the cluster backend and the node-operations layer that need no cluster.

The backend against a real cluster runs in the kind tier (``nox -s e2e``: a kind cluster made by kind's
CLI, reached only through its kubeconfig).
"""

from __future__ import annotations

import base64
import subprocess
import sys
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from pytest_devplug.backends import create_backend
from pytest_devplug.backends.base import BackendOptions, ExecResult, NodeSpec, PluginSpec
from pytest_devplug.errors import (
    BackendError,
    BackendUnavailableError,
    NodeCommandError,
    NodeGrpcError,
    UnsupportedOperationError,
)
from pytest_devplug.backends.k8s import gpunode
from pytest_devplug.backends.k8s.backend import KubeBackend
from pytest_devplug.backends.k8s.hostpod import MANAGED_BY, NODE_POD_DEADLINE_S, node_pod_manifest
from pytest_devplug.backends.k8s.manifests import own_daemonset, render_daemonsets, selector_of
from pytest_devplug.api.podresources import v1_pb2, v1_pb2_grpc
from pytest_devplug.backends.k8s.nodeops import GRPC_CALL, NodeOps

pytest_plugins = ["pytester"]


class LocalTransport:
    """Runs node scripts on this machine: NodeOps' file and command handling, end to end."""

    bypasses_kubelet = True

    def __init__(self) -> None:
        self.scripts: list[str] = []

    def run(self, node: str, script: str, *, timeout: float) -> ExecResult:
        self.scripts.append(script)
        p = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=timeout)
        return ExecResult(p.returncode, p.stdout, p.stderr)

    def grpc_call(
        self, node: str, socket: str, method: str, request: bytes, *, timeout: float, stream: bool = False
    ) -> bytes:
        raise AssertionError("not called")

    def close(self) -> None:
        pass


def test_node_files_round_trip_binary_content_atomically(tmp_path: Path) -> None:
    ops = NodeOps(LocalTransport(), timeout=10)
    target = tmp_path / "sub dir" / "state.json"
    data = bytes(range(256)) * 3
    ops.write_file("n1", str(target), data)
    assert target.read_bytes() == data
    assert ops.read_file("n1", str(target)) == data
    assert ops.read_file("n1", str(tmp_path / "missing")) is None
    assert not list(target.parent.glob("*.devplug-tmp"))


class _GetOnly(v1_pb2_grpc.PodResourcesListerServicer):
    """A pod-resources server that answers ``Get`` with the pod it was asked for, one device per container (or, with
    ``disabled``, as a kubelet whose KubeletPodResourcesGet gate is off)."""

    def __init__(self, disabled: bool = False) -> None:
        self.disabled = disabled

    def Get(self, request: v1_pb2.GetPodResourcesRequest, context: Any) -> v1_pb2.GetPodResourcesResponse:  # noqa: N802
        if self.disabled:
            context.abort(grpc.StatusCode.UNKNOWN, "PodResources API Get method disabled")
        devices = [v1_pb2.ContainerDevices(resource_name="example.com/x", device_ids=["x-1"])]
        pod = v1_pb2.PodResources(
            name=request.pod_name,
            namespace=request.pod_namespace,
            containers=[v1_pb2.ContainerResources(name="main", devices=devices)],
        )
        return v1_pb2.GetPodResourcesResponse(pod_resources=pod)


@pytest.mark.parametrize("disabled", [False, True], ids=["served", "gate-off"])
def test_pod_resources_get_sends_its_request_through_the_node_script(tmp_path: Path, disabled: bool) -> None:
    """The script a node transport runs next to the kubelet's socket carries ``Get``'s request (base64); a kubelet
    with Get switched off is a backend that cannot, naming the feature gate."""
    sock = tmp_path / "pr.sock"
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    v1_pb2_grpc.add_PodResourcesListerServicer_to_server(_GetOnly(disabled), server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(f"unix://{sock}")
    server.start()

    class ScriptTransport(LocalTransport):
        def grpc_call(
            self, node: str, socket: str, method: str, request: bytes, *, timeout: float, stream: bool = False
        ) -> bytes:
            argv = [
                sys.executable,
                "-c",
                GRPC_CALL,
                str(sock),
                method,
                base64.b64encode(request).decode(),
                str(timeout),
                "unary",
            ]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
            if done.returncode != 0:  # as the node-pod transport reports a failed call
                raise NodeGrpcError.from_stderr(done.stderr) or BackendError(
                    f"{method} on node {node} failed: {done.stderr[-1500:]}"
                )
            return base64.b64decode(done.stdout)

    try:
        if disabled:
            with pytest.raises(UnsupportedOperationError, match="KubeletPodResourcesGet is off"):
                NodeOps(ScriptTransport(), timeout=10).pod_resources_get("n1", "web-1", "team-a")
            return
        got = NodeOps(ScriptTransport(), timeout=10).pod_resources_get("n1", "web-1", "team-a")
    finally:
        server.stop(0)
    assert (got.name, got.namespace) == ("web-1", "team-a")
    assert [(c.name, c.device_ids("example.com/x")) for c in got.containers] == [("main", ["x-1"])]


def test_a_failing_node_command_names_the_node_and_the_error() -> None:
    ops = NodeOps(LocalTransport(), timeout=10)
    with pytest.raises(NodeCommandError, match=r"on node n1 exited 3: boom"):
        ops.exec("n1", "echo boom >&2; exit 3")


def test_the_node_pod_is_privileged_in_the_host_pid_namespace_on_its_node() -> None:
    pod = node_pod_manifest("gpu-7", "devplug-node-x", "devplug-ab", "img:1")
    spec = pod["spec"]
    assert spec["nodeName"] == "gpu-7" and spec["hostPID"] is True
    assert spec["containers"][0]["securityContext"] == {"privileged": True}
    assert spec["tolerations"] == [{"operator": "Exists"}]
    assert pod["metadata"]["labels"][MANAGED_BY[0]] == MANAGED_BY[1]
    assert spec["activeDeadlineSeconds"] == NODE_POD_DEADLINE_S > 0, "a leftover privileged pod stops by itself"


def test_the_plugin_daemonset_is_ours_and_pinned_to_the_node_under_test() -> None:
    backend = create_backend("cluster", BackendOptions())
    assert isinstance(backend, KubeBackend) and backend.name == "cluster"
    (ds,) = render_daemonsets(PluginSpec(mock=True), "plugin:1")
    owned = own_daemonset(ds, backend.namespace, "gpu-7", dict([MANAGED_BY]))
    assert owned["metadata"]["namespace"] == backend.namespace == backend.pod_namespace
    assert backend.namespace.startswith("devplug-")
    assert owned["metadata"]["labels"][MANAGED_BY[0]] == MANAGED_BY[1]
    assert owned["spec"]["template"]["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "gpu-7"}


def test_the_included_plugin_without_mock_runs_on_real_nvml() -> None:
    (ds,) = render_daemonsets(PluginSpec(mock=False), "plugin:1")
    env = {e["name"]: e.get("value") for e in ds["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["DP_NVML"] == "real" and env["DP_CREATE_DEV_NODES"] == "false"
    (mock,) = render_daemonsets(PluginSpec(mock=True), "plugin:1")
    env = {e["name"]: e.get("value") for e in mock["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["DP_NVML"] == "mock"


def test_an_unreadable_kubeconfig_is_named(tmp_path: Path) -> None:
    backend = create_backend("cluster", BackendOptions(kubeconfig=str(tmp_path / "nope")))
    with pytest.raises(BackendUnavailableError, match="cannot load kubeconfig .*nope"):
        backend.start()


def test_disruptive_tests_skip_on_the_cluster_backend_unless_allowed(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.devplug_disruptive
        def test_restarts_the_kubelet():
            pass

        def test_harmless():
            pass
        """
    )
    res = pytester.runpytest("--devplug-backend", "cluster", "-rs")
    res.assert_outcomes(passed=1, skipped=1)
    res.stdout.fnmatch_lines(["*disrupts the node under test*--devplug-allow-disruptive*"])
    pytester.runpytest("--devplug-backend", "cluster", "--devplug-allow-disruptive").assert_outcomes(passed=2)
    pytester.runpytest("--devplug-backend", "sim").assert_outcomes(passed=2)


class _ApiNodes:
    """The one API call node picking makes."""

    def __init__(self, *names: str) -> None:
        self.names = names

    def list_nodes(self) -> list[dict[str, Any]]:
        return [{"metadata": {"name": n, "labels": {}}, "status": {}} for n in self.names]


def _started(backend: KubeBackend, transport: Any, *nodes: str) -> KubeBackend:
    """``backend`` as if started: its API lists ``nodes``, node operations go through ``transport``."""
    backend._api = _ApiNodes(*nodes)  # type: ignore[assignment]
    backend._nodeops = NodeOps(transport, timeout=10)
    return backend


def test_the_soaks_second_node_is_the_one_named_and_never_the_node_under_test() -> None:
    spec = NodeSpec("devplug-soak", resource_name="nvidia.com/gpu", beside="w2")
    bare = _started(create_backend("cluster", BackendOptions(node="w2")), LocalTransport(), "w1", "w2", "w3")
    with pytest.raises(
        UnsupportedOperationError, match=r"second node beside w2.*--devplug-second-node NAME.*\['w1', 'w2', 'w3'\]"
    ):
        bare._pick_node(spec)
    assert (
        _started(
            create_backend("cluster", BackendOptions(node="w2", second_node="w3")), LocalTransport(), "w1", "w2", "w3"
        )._pick_node(spec)
        == "w3"
    )
    same = _started(create_backend("cluster", BackendOptions(node="w2", second_node="w2")), LocalTransport(), "w2")
    with pytest.raises(UnsupportedOperationError, match="is the node under test"):
        same._pick_node(spec)
    absent = _started(create_backend("cluster", BackendOptions(node="w2", second_node="w9")), LocalTransport(), "w2")
    with pytest.raises(BackendUnavailableError, match="--devplug-second-node w9: no such node"):
        absent._pick_node(spec)


def test_two_plugins_of_one_run_get_daemonsets_that_neither_replace_nor_adopt_each_other() -> None:
    (a,) = render_daemonsets(PluginSpec(mock=True), "plugin:1")
    (b,) = render_daemonsets(PluginSpec(mock=True), "plugin:1")
    a, b = own_daemonset(a, "ns", "gpu-1", {}), own_daemonset(b, "ns", "gpu-2", {})
    assert a["metadata"]["name"] != b["metadata"]["name"]
    assert a["metadata"]["name"].startswith("devplug-gpu-plugin-")
    assert selector_of(a) != selector_of(b)
    for ds in (a, b):
        labels = ds["spec"]["template"]["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in ds["spec"]["selector"]["matchLabels"].items()), "the pods match"


def test_the_kubelet_cannot_be_kept_down_through_the_kubelet() -> None:
    """The cluster backend reaches a node by API exec, which its kubelet serves: stop, start and reboot say so."""
    transport = LocalTransport()
    transport.bypasses_kubelet = False
    backend = _started(create_backend("cluster", BackendOptions()), transport, "w1")
    for op in (backend.stop_kubelet, backend.start_kubelet, backend.reboot_node):
        with pytest.raises(UnsupportedOperationError, match="reaches node w1 only through its kubelet"):
            op("w1")
    assert transport.scripts == [], "nothing ran on the node"


def test_a_node_without_crictl_is_named_when_a_reboot_needs_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "sh").symlink_to("/bin/sh")
    monkeypatch.setenv("PATH", str(tmp_path))  # a shell, no crictl
    ops = NodeOps(LocalTransport(), timeout=10)
    with pytest.raises(
        NodeCommandError, match="on node n1 exited 127: crictl \\(cri-tools\\) is not installed on the node"
    ):
        ops.remove_pod_sandboxes("n1")


def test_node_files_of_directories_are_copied_with_their_paths(tmp_path: Path) -> None:
    src = tmp_path / "node" / "cdi"
    src.mkdir(parents=True)
    (src / "vendor.json").write_bytes(b'{"cdiVersion": "0.5.0"}\n\x00')
    (src / "sub").mkdir()
    into = tmp_path / "copy"
    NodeOps(LocalTransport(), timeout=10).read_tree("n1", [str(src), str(tmp_path / "missing")], into)
    assert (into / str(src).lstrip("/") / "vendor.json").read_bytes() == b'{"cdiVersion": "0.5.0"}\n\x00'
    assert not (into / str(src).lstrip("/") / "sub").exists()


def test_a_mock_gpu_node_is_made_only_where_absent_and_removed_as_made() -> None:
    script = gpunode.make_script([0, 2], "/var/lib/devplug/lib/libnvidia-ml.so.1")
    for path in ("/dev/nvidia0", "/dev/nvidia2", "/dev/nvidiactl", "/dev/nvidia-uvm", "/run/nvidia/driver/dev/nvidia2"):
        assert f"node {path}" in script
    assert "/dev/nvidia1" not in script
    assert "if [ ! -e /run/nvidia/driver ]; then" in script, "an existing driver root is left alone"
    assert (
        "ln -s /var/lib/devplug/lib/libnvidia-ml.so.1 "
        "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15" in script
    )
    assert f"[ -e {gpunode.HOOK_PATH} ] ||" in script
    assert gpunode.remove_script(["/dev/nvidia0", "/run/nvidia/driver"]) == "rm -rf -- /dev/nvidia0 /run/nvidia/driver"
    assert gpunode.remove_script([]) == "true"
