"""Node operations through the node container (``docker exec``): kubelet, journal, checkpoint, files, pod-resources.

A kind node is a Docker container running systemd, so the kubelet is ``systemctl restart kubelet`` away
and its files are ``cat`` away. pod-resources is a gRPC service on a Unix socket inside the node; we
reach it from the host through the node's ``/var`` volume (a short symlink keeps the path under the
108-byte ``sun_path`` limit) and, where that volume is not readable (rootless Docker, Docker Desktop),
through a one-off container sharing the node's volumes (``docker run --volumes-from``) with the
plugin image, which has Python and grpcio.
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import time
from pathlib import Path
from typing import Any

import grpc

from ...api.podresources import v1_pb2, v1_pb2_grpc
from ..base import BackendError, PodResourcesDevices, PodResourcesPod
from .proc import run, run_bytes

__all__ = ["NodeOps", "CHECKPOINT_PATH", "POD_RESOURCES_SOCKET", "MOCK_STATE_PATH"]

CHECKPOINT_PATH = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
#: Where the included plugin's DaemonSet reads the mock-NVML state (a hostPath on the node).
MOCK_STATE_PATH = "/var/lib/devplug/mock-state.json"

#: Run in a container sharing the node's /var when the host cannot reach the socket: raw gRPC bytes, base64.
_REMOTE_CALL = (
    "import base64,sys,grpc\n"
    "ch=grpc.insecure_channel('unix://" + POD_RESOURCES_SOCKET + "')\n"
    "f=ch.unary_unary(sys.argv[1],request_serializer=None,response_deserializer=None)\n"
    "sys.stdout.write(base64.b64encode(f(b'',timeout=float(sys.argv[2]))).decode())\n"
)


class NodeOps:
    """Operations on the node containers of one cluster (node name == container name in kind)."""

    def __init__(self, workdir: Path, timeout: float) -> None:
        self.workdir = workdir
        self.timeout = timeout
        self.helper_image: str | None = None  # an image with python3 + grpcio, for the fallback path
        self._since: dict[str, str] = {}

    def exec(self, node: str, script: str, *, input: str | None = None, timeout: float | None = None) -> str:
        proc = run(
            ["docker", "exec", "-i", node, "sh", "-c", script], input=input, timeout=timeout or max(self.timeout, 60)
        )
        return proc.stdout

    # -- kubelet -----------------------------------------------------------------------------------
    def mark_log_start(self, node: str) -> None:
        """Read the kubelet journal from now on (a reused cluster's old runs are not this session's)."""
        self._since[node] = self.exec(node, "date -u '+%Y-%m-%d %H:%M:%S'").strip()

    def restart_kubelet(self, node: str) -> None:
        self.exec(node, "systemctl restart kubelet")

    def kubelet_active(self, node: str) -> bool:
        return run(["docker", "exec", node, "systemctl", "is-active", "--quiet", "kubelet"], check=False).returncode == 0

    def kubelet_log(self, node: str) -> str:
        since = self._since.get(node)
        cmd = "journalctl -u kubelet --no-pager -o short-iso"
        if since:
            cmd += f" --since {shlex.quote(since)}"
        return self.exec(node, cmd, timeout=120)

    def numa_nodes(self, node: str) -> list[int]:
        """NUMA node IDs the node's kubelet sees: ``/sys/devices/system/node/node<N>`` (the host's; cadvisor's
        source). None listed (a kernel without NUMA): taken as the single node 0."""
        out = self.exec(node, "ls /sys/devices/system/node 2>/dev/null || true")
        ids = sorted(int(n[4:]) for n in out.split() if n.startswith("node") and n[4:].isdigit())
        return ids or [0]

    def kubelet_config(self, node: str) -> str:
        return self.exec(node, "cat /var/lib/kubelet/config.yaml")

    def set_kubelet_config(self, node: str, text: str) -> None:
        """Replace the kubelet's config file and restart it (used for per-test Topology Manager policies)."""
        self.write_file(node, "/var/lib/kubelet/config.yaml", text.encode())
        self.restart_kubelet(node)

    # -- files -------------------------------------------------------------------------------------
    def read_file(self, node: str, path: str) -> bytes | None:
        rc, out, err = run_bytes(
            ["docker", "exec", node, "sh", "-c", f"if [ -e {shlex.quote(path)} ]; then cat {shlex.quote(path)}; else exit 3; fi"]
        )
        if rc == 3:
            return None
        if rc != 0:
            raise BackendError(f"reading {path} on node {node} failed ({rc}): {err}")
        return out

    def write_file(self, node: str, path: str, data: bytes) -> None:
        """Atomic replace on the node: a temp file in the same directory, then ``mv``."""
        d, tmp = os.path.dirname(path), shlex.quote(f"{path}.devplug-tmp")
        rc, _, err = run_bytes(
            ["docker", "exec", "-i", node, "sh", "-c", f"mkdir -p {shlex.quote(d)} && cat > {tmp} && mv -f {tmp} {shlex.quote(path)}"],
            input=data,
        )
        if rc != 0:
            raise BackendError(f"writing {path} on node {node} failed ({rc}): {err}")

    def read_checkpoint(self, node: str) -> bytes | None:
        return self.read_file(node, CHECKPOINT_PATH)

    def read_json(self, node: str, path: str) -> dict[str, Any]:
        raw = self.read_file(node, path)
        if raw is None:
            raise BackendError(f"no {path} on node {node}")
        return dict(json.loads(raw))

    # -- pod-resources ---------------------------------------------------------------------------
    def _host_socket(self, node: str) -> str | None:
        """A short host path to the node's pod-resources socket, when the host can reach it."""
        link = self.workdir / f"pr-{node}"
        if not link.exists():
            proc = run(["docker", "inspect", "-f", "{{json .Mounts}}", node], timeout=60)
            for m in json.loads(proc.stdout or "[]"):
                if m.get("Destination") == "/var" and m.get("Source"):
                    target = Path(m["Source"]) / "lib/kubelet/pod-resources"
                    try:
                        if (target / "kubelet.sock").exists() and os.access(target, os.R_OK | os.X_OK):
                            link.symlink_to(target)
                    except OSError:
                        return None
        sock = link / "kubelet.sock"
        return str(sock) if len(str(sock)) < 100 and sock.exists() else None

    def _call(self, node: str, method: str, request: Any, response_type: Any) -> Any:
        full = f"/v1.PodResourcesLister/{method}"
        sock = self._host_socket(node)
        if sock is not None:
            with grpc.insecure_channel(f"unix://{sock}") as channel:
                stub = v1_pb2_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
                return getattr(stub, method)(request, timeout=self.timeout)
        if self.helper_image is None:
            raise BackendError(
                f"cannot reach the pod-resources socket of node {node}: its /var volume is not readable from "
                "this host and no helper image (python3 + grpcio) is known"
            )
        proc = run(
            ["docker", "run", "--rm", "--volumes-from", node, "--entrypoint", "python3", self.helper_image,
             "-c", _REMOTE_CALL, full, str(self.timeout)],
            timeout=self.timeout + 60,
        )  # fmt: skip
        return response_type.FromString(base64.b64decode(proc.stdout.strip()))

    def pod_resources(self, node: str) -> list[PodResourcesPod]:
        resp = self._call(node, "List", v1_pb2.ListPodResourcesRequest(), v1_pb2.ListPodResourcesResponse)
        return [PodResourcesPod.from_proto(p) for p in resp.pod_resources]

    def allocatable_devices(self, node: str) -> list[PodResourcesDevices]:
        resp = self._call(
            node, "GetAllocatableResources", v1_pb2.AllocatableResourcesRequest(), v1_pb2.AllocatableResourcesResponse
        )
        return [PodResourcesDevices.from_proto(d) for d in resp.devices]

    def wait_kubelet_serving(self, node: str, timeout: float) -> None:
        """After a restart: the unit is active and pod-resources answers (bounded; says what it waited for)."""
        deadline = time.monotonic() + timeout
        last: str = "not checked"
        while time.monotonic() < deadline:
            try:
                if self.kubelet_active(node):
                    self.allocatable_devices(node)
                    return
                last = "kubelet unit not active"
            except (BackendError, grpc.RpcError) as exc:
                last = f"pod-resources not answering: {exc}"
            time.sleep(0.5)
        raise BackendError(f"kubelet on {node} not serving {timeout:g}s after a restart: {last}")
