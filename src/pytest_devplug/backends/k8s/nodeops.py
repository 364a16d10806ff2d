"""Node operations of a real cluster (kubelet, journal, checkpoint, files, pod-resources) over one transport.

Every operation is a shell script run as root in the node's host namespaces, or one raw pod-resources
call; the :class:`NodeTransport` decides how the node is reached (kind: ``docker exec`` into the node
container; any cluster: a privileged host-PID pod, :mod:`.hostpod`). Files travel base64-encoded, so
binary content and an exec stream that carries text are both fine.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import grpc

from ...api.podresources import v1_pb2
from ...waiting import wait_for
from ...errors import BackendError, NodeCommandError, UnsupportedOperationError, WaitTimeout
from ..base import ExecResult, PodResourcesDevices, PodResourcesPod

__all__ = [
    "NodeTransport",
    "NodeOps",
    "CHECKPOINT_PATH",
    "POD_RESOURCES_SOCKET",
    "MOCK_STATE_PATH",
    "KUBELET_CONFIG_PATH",
    "GRPC_CALL",
]

CHECKPOINT_PATH = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
#: kubeadm's (and kind's) kubelet config file; the Topology Manager tests switch its policy.
KUBELET_CONFIG_PATH = "/var/lib/kubelet/config.yaml"
#: A kubelet's answer to pod-resources Get while its feature gate ``KubeletPodResourcesGet`` is off.
GET_DISABLED = "PodResources API Get method disabled"
#: Where the included plugin's DaemonSet reads the mock-NVML state (a hostPath on the node).
MOCK_STATE_PATH = "/var/lib/devplug/mock-state.json"

#: A gRPC call to a Unix socket of the node where only a process next to the socket reaches it: argv socket,
#: full method, request (base64), timeout, "stream" (the first message of a server stream) or "unary"; prints
#: the raw response, base64; a gRPC error is ``RPCERROR <code name> <details>`` on stderr with exit status 4.
#: Needs python3 with grpcio (the included plugin's image has both).
GRPC_CALL = (
    "import base64,sys,grpc\n"
    "sock,method,req,timeout,kind=sys.argv[1:6]\n"
    "ch=grpc.insecure_channel('unix://'+sock,options=[('grpc.default_authority','localhost')])\n"
    "try:\n"
    " if kind=='stream':\n"
    "  it=ch.unary_stream(method,request_serializer=None,response_deserializer=None)"
    "(base64.b64decode(req),timeout=float(timeout))\n"
    "  out=next(iter(it))\n"
    "  it.cancel()\n"
    " else:\n"
    "  out=ch.unary_unary(method,request_serializer=None,response_deserializer=None)"
    "(base64.b64decode(req),timeout=float(timeout))\n"
    "except grpc.RpcError as e:\n"
    " sys.stderr.write('RPCERROR %s %s' % (e.code().name, e.details()))\n"
    " sys.exit(4)\n"
    "except StopIteration:\n"
    " sys.stderr.write('RPCERROR STREAM_ENDED the stream ended without a message')\n"
    " sys.exit(4)\n"
    "sys.stdout.write(base64.b64encode(out).decode())\n"
)


class NodeTransport(Protocol):
    """How a backend reaches a node's host: the seam between node operations and kind or a real cluster."""

    #: Whether commands reach the node while its kubelet is down: ``docker exec`` does; an API ``exec`` goes
    #: through the kubelet and does not. Keeping a kubelet down and a node reboot need it.
    bypasses_kubelet: bool

    def run(self, node: str, script: str, *, timeout: float) -> ExecResult:
        """Run ``sh -c script`` as root in the node's host mount and PID namespaces. Raises ``BackendError``
        when the node cannot be reached (a non-zero exit is returned, not raised)."""
        ...

    def grpc_call(
        self, node: str, socket: str, method: str, request: bytes, *, timeout: float, stream: bool = False
    ) -> bytes:
        """The raw response of ``method`` (``/v1.PodResourcesLister/List``) at the node's Unix ``socket`` (its path on
        the node) for the serialized ``request``; with ``stream`` the first message of the server stream. A gRPC
        error raises :class:`~pytest_devplug.errors.NodeGrpcError`; a node that cannot be reached ``BackendError``."""
        ...

    def close(self) -> None:
        """Remove whatever the transport made (pods, links)."""
        ...


#: containerd IDs: 64 lower-case hex digits (``containerd://<id>`` in a container status).
_CONTAINERD_ID = re.compile(r"[0-9a-f]{64}")


class NodeOps:
    """Operations on the nodes of one cluster, over ``transport``."""

    def __init__(self, transport: NodeTransport, timeout: float) -> None:
        self.transport = transport
        self.timeout = timeout
        self._since: dict[str, str] = {}

    def exec(self, node: str, script: str, *, timeout: float | None = None) -> str:
        """Run ``script`` on the node; its stdout. A non-zero exit raises :class:`NodeCommandError`."""
        res = self.transport.run(node, script, timeout=timeout or max(self.timeout, 60.0))
        if res.returncode != 0:
            raise NodeCommandError(
                f"`{script[:200]}` on node {node} exited {res.returncode}: {res.stderr.strip()[-1500:]}"
            )
        return res.stdout

    def kill_container(self, node: str, container_id: str) -> None:
        """SIGKILL a container's task in containerd. The ID comes from the pod's status and the
        command runs as root on the node, so it must be a containerd ID and is quoted besides."""
        if not _CONTAINERD_ID.fullmatch(container_id):
            raise BackendError(f"not a containerd container ID: {container_id!r}")
        self.exec(node, f"ctr -n k8s.io task kill -s SIGKILL {shlex.quote(container_id)}")

    # -- kubelet -----------------------------------------------------------------------------------
    def mark_log_start(self, node: str) -> None:
        """Read the kubelet journal from now on (a reused cluster's old runs are not this session's)."""
        self._since[node] = self.exec(node, "date -u '+%Y-%m-%d %H:%M:%S'").strip()

    def _kubelet_instance(self, node: str) -> str:
        """What changes with every start of the kubelet unit (systemd's invocation ID and main PID)."""
        return self.exec(node, "systemctl show -p InvocationID -p MainPID kubelet").strip()

    def restart_kubelet(self, node: str) -> None:
        """Restart the kubelet unit and wait until the new one serves pod-resources.

        ``--no-block``: on a real cluster the command travels through the kubelet being restarted (exec
        streams end at it), so the restart is queued and the new instance is recognised by its unit's
        invocation ID instead."""
        before = self._kubelet_instance(node)
        try:
            self.exec(node, "systemctl restart --no-block kubelet")
        except BackendError as exc:
            # The stream may end before the queued restart is acknowledged (a 1.37 kubelet goes down that fast):
            # whether it restarted is what the new invocation ID tells, or the wait below says why not.
            if "connection" not in str(exc).lower():
                raise
        self.wait_kubelet_serving(node, max(self.timeout, 60.0), not_instance=before)

    def stop_kubelet(self, node: str) -> None:
        """Stop the kubelet unit and leave it down. Its containers keep running: the unit's ``KillMode=process``
        (kind's and kubeadm's) stops the kubelet process only."""
        self.exec(node, "systemctl stop kubelet")
        if self.kubelet_active(node):
            raise NodeCommandError(f"the kubelet on node {node} is still active after `systemctl stop kubelet`")

    def start_kubelet(self, node: str) -> None:
        """Start a stopped kubelet unit and wait until it serves pod-resources."""
        before = self._kubelet_instance(node)
        self.exec(node, "systemctl start kubelet")
        self.wait_kubelet_serving(node, max(self.timeout, 60.0), not_instance=before)

    def remove_pod_sandboxes(self, node: str) -> None:
        """Stop and remove every pod sandbox (and so every container) through the CRI, as upstream's node e2e
        tests stage a reboot (``crictl rmp --force --all``: containers are killed, not stopped gracefully)."""
        self.exec(
            node,
            "command -v crictl >/dev/null || "
            "{ echo 'crictl (cri-tools) is not installed on the node' >&2; exit 127; }; "
            'crictl rmp --force --all >/dev/null && test -z "$(crictl pods -q)"',
        )

    def empty_directory(self, node: str, path: str) -> None:
        """Remove what ``path`` holds on the node, keeping the directory (a missing one is left missing)."""
        self.exec(node, f"if [ -d {shlex.quote(path)} ]; then find {shlex.quote(path)} -mindepth 1 -delete; fi")

    def kubelet_active(self, node: str) -> bool:
        return self.transport.run(node, "systemctl is-active --quiet kubelet", timeout=60.0).returncode == 0

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
        raw = self.read_file(node, KUBELET_CONFIG_PATH)
        if raw is None:
            raise BackendError(
                f"no kubelet config file {KUBELET_CONFIG_PATH} on node {node} (not a kubeadm-style node)"
            )
        return raw.decode()

    def set_kubelet_config(self, node: str, text: str) -> None:
        """Replace the kubelet's config file and restart it (used for per-test Topology Manager policies)."""
        self.write_file(node, KUBELET_CONFIG_PATH, text.encode())
        self.restart_kubelet(node)

    # -- files -------------------------------------------------------------------------------------
    def read_file(self, node: str, path: str) -> bytes | None:
        q = shlex.quote(path)
        res = self.transport.run(
            node, f"if [ -e {q} ]; then base64 < {q}; else exit 3; fi", timeout=max(self.timeout, 60.0)
        )
        if res.returncode == 3:
            return None
        if res.returncode != 0:
            raise NodeCommandError(f"reading {path} on node {node} failed ({res.returncode}): {res.stderr.strip()}")
        return base64.b64decode(res.stdout)

    def write_file(self, node: str, path: str, data: bytes) -> None:
        """Atomic replace on the node: a temp file in the same directory, then ``mv``."""
        d, tmp, dst = shlex.quote(os.path.dirname(path)), shlex.quote(f"{path}.devplug-tmp"), shlex.quote(path)
        b64 = base64.b64encode(data).decode()
        self.exec(node, f"mkdir -p {d} && printf %s {b64} | base64 -d > {tmp} && mv -f {tmp} {dst}")

    def read_checkpoint(self, node: str) -> bytes | None:
        return self.read_file(node, CHECKPOINT_PATH)

    def read_tree(self, node: str, directories: Sequence[str], into: Path, *, recursive: bool = False) -> None:
        """Copy the plain files of ``directories`` on the node (``recursive``: and of their subdirectories) to
        ``into`` + their paths."""
        files = '$(find "$d" -type f 2>/dev/null)' if recursive else '"$d"/*'
        script = (
            "for d in " + " ".join(shlex.quote(d) for d in directories) + "; do "
            f'for f in {files}; do [ -f "$f" ] && printf \'%s %s\\n\' "$f" "$(base64 -w0 < "$f")"; done; done; true'
        )
        for line in self.exec(node, script).splitlines():
            path, _, b64 = line.partition(" ")
            local = into / path.lstrip("/")
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_bytes(base64.b64decode(b64))

    def read_json(self, node: str, path: str) -> dict[str, Any]:
        raw = self.read_file(node, path)
        if raw is None:
            raise BackendError(f"no {path} on node {node}")
        return dict(json.loads(raw))

    # -- pod-resources ---------------------------------------------------------------------------
    def _call(self, node: str, method: str, response_type: Any, request: bytes = b"") -> Any:
        raw = self.transport.grpc_call(
            node, POD_RESOURCES_SOCKET, f"/v1.PodResourcesLister/{method}", request, timeout=self.timeout
        )
        return response_type.FromString(raw)

    def pod_resources_get(self, node: str, name: str, namespace: str) -> PodResourcesPod:
        request = v1_pb2.GetPodResourcesRequest(pod_name=name, pod_namespace=namespace).SerializeToString()
        try:
            resp = self._call(node, "Get", v1_pb2.GetPodResourcesResponse, request)
        except (grpc.RpcError, BackendError) as exc:  # kind calls the socket from this host; a node pod runs the script
            text = f"{exc.code().name}: {exc.details()}" if isinstance(exc, grpc.RpcError) else str(exc)
            if GET_DISABLED in text:
                raise UnsupportedOperationError(
                    f"the kubelet on {node} answers pod-resources Get with {GET_DISABLED!r}: its feature gate "
                    "KubeletPodResourcesGet is off"
                ) from None
            raise BackendError(f"pod-resources Get({namespace}/{name}) on {node}: {text}") from None
        return PodResourcesPod.from_proto(resp.pod_resources)

    def pod_resources(self, node: str) -> list[PodResourcesPod]:
        resp = self._call(node, "List", v1_pb2.ListPodResourcesResponse)
        return [PodResourcesPod.from_proto(p) for p in resp.pod_resources]

    def allocatable_devices(self, node: str) -> list[PodResourcesDevices]:
        resp = self._call(node, "GetAllocatableResources", v1_pb2.AllocatableResourcesResponse)
        return [PodResourcesDevices.from_proto(d) for d in resp.devices]

    def wait_kubelet_serving(self, node: str, timeout: float, *, not_instance: str | None = None) -> None:
        """The unit is active (a new instance, when ``not_instance`` is given) and pod-resources answers."""

        def probe() -> str:
            if not_instance is not None and self._kubelet_instance(node) == not_instance:
                return "the old kubelet is still running"
            if not self.kubelet_active(node):
                return "kubelet unit not active"
            self.allocatable_devices(node)
            return ""

        try:
            wait_for(
                probe,
                lambda why: not why,
                timeout=timeout,
                interval=0.5,
                what=f"the kubelet on {node} serving pod-resources after a restart",
                retry_on=(BackendError, grpc.RpcError),
            )
        except WaitTimeout as exc:
            raise BackendError(str(exc)) from None
