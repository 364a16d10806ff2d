"""How the kind backend reaches a node: ``docker exec`` into its node container (the ``NodeTransport`` of kind).

A kind node is a Docker container running systemd, so the kubelet is ``systemctl`` away and its files
are ``cat`` away, with no image in the cluster and nothing that depends on the kubelet being up (a
kubelet restart cannot cut the command off). pod-resources is a gRPC service on a Unix socket inside
the node; we reach it from the host through the node's ``/var`` volume (a short symlink keeps the path
under the 108-byte ``sun_path`` limit) and, where that volume is not readable (rootless Docker, Docker
Desktop), through a one-off container sharing the node's volumes (``docker run --volumes-from``) with
the plugin image, which has Python and grpcio.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable
from pathlib import Path

import grpc

from ..base import BackendError, ExecResult
from ..k8s.node import POD_RESOURCES_CALL
from .proc import run, run_bytes

__all__ = ["DockerExecTransport"]


class DockerExecTransport:
    """``NodeTransport`` over ``docker exec`` (node name == container name in kind)."""

    #: ``docker exec`` reaches the node container whether its kubelet runs or not.
    bypasses_kubelet = True

    def __init__(self, workdir: Path, *, helper_image: Callable[[], str | None] = lambda: None) -> None:
        """``helper_image``: an image with python3 + grpcio for the fallback path, once one is known."""
        self.workdir = workdir
        self._helper_image = helper_image

    def run(self, node: str, script: str, *, timeout: float) -> ExecResult:
        rc, out, err = run_bytes(["docker", "exec", node, "sh", "-c", script], timeout=timeout)
        return ExecResult(rc, out.decode(errors="replace"), err)

    def close(self) -> None:
        """Nothing to remove: the links live in the backend's work dir."""

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

    def pod_resources_call(self, node: str, method: str, *, timeout: float, request: bytes = b"") -> bytes:
        sock = self._host_socket(node)
        if sock is not None:
            with grpc.insecure_channel(f"unix://{sock}") as channel:
                call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
                return bytes(call(request, timeout=timeout))
        helper = self._helper_image()
        if helper is None:
            raise BackendError(
                f"cannot reach the pod-resources socket of node {node}: its /var volume is not readable from "
                "this host and no helper image (python3 + grpcio) is known"
            )
        proc = run(
            ["docker", "run", "--rm", "--volumes-from", node, "--entrypoint", "python3", helper,
             "-c", POD_RESOURCES_CALL, method, str(timeout), base64.b64encode(request).decode()],
            timeout=timeout + 60,
        )  # fmt: skip
        return base64.b64decode(proc.stdout.strip())
