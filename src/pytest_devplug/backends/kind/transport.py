"""How the kind backend reaches a node: ``docker exec`` into its node container (the ``NodeTransport`` of kind).

A kind node is a Docker container running systemd, so the kubelet is ``systemctl`` away and its files
are ``cat`` away, with no image in the cluster and nothing that depends on the kubelet being up (a
kubelet restart cannot cut the command off). pod-resources and a DRA driver's sockets are gRPC services
on Unix sockets under the node's ``/var``; we reach them from the host through the node's ``/var`` volume
(a short symlink to it keeps the path under the 108-byte ``sun_path`` limit) and, where that volume is not
readable (rootless Docker, Docker Desktop) or the path is still too long, through a one-off container
sharing the node's volumes (``docker run --volumes-from``) with the plugin image, which has Python and grpcio.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import grpc

from ..base import ExecResult
from ...errors import BackendError, NodeGrpcError
from ..k8s.nodeops import GRPC_CALL
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

    def _host_var(self, node: str) -> Path | None:
        """A short host path to the node's ``/var`` volume, when the host can read it: a link named by a digest of the
        node's name, since a socket path holds at most 107 bytes and a long cluster name would use them up."""
        link = self.workdir / f"v-{hashlib.sha256(node.encode()).hexdigest()[:10]}"
        if not link.exists():
            proc = run(["docker", "inspect", "-f", "{{json .Mounts}}", node], timeout=60)
            for m in json.loads(proc.stdout or "[]"):
                if m.get("Destination") == "/var" and m.get("Source"):
                    try:
                        if os.access(m["Source"], os.R_OK | os.X_OK):
                            link.symlink_to(m["Source"])
                    except OSError:
                        return None
        return link if link.exists() else None

    def _host_socket(self, node: str, socket: str) -> str | None:
        """The node's ``socket`` (a path under its ``/var``) as the host reaches it, if it can."""
        var = self._host_var(node) if socket.startswith("/var/") else None
        if var is None:
            return None
        sock = var / socket[len("/var/") :]
        return str(sock) if len(str(sock)) < 100 and sock.exists() else None

    def grpc_call(
        self, node: str, socket: str, method: str, request: bytes, *, timeout: float, stream: bool = False
    ) -> bytes:
        sock = self._host_socket(node, socket)
        if sock is not None:
            with grpc.insecure_channel(f"unix://{sock}", options=[("grpc.default_authority", "localhost")]) as channel:
                try:
                    if stream:
                        answers = channel.unary_stream(method, request_serializer=None, response_deserializer=None)(
                            request, timeout=timeout
                        )
                        try:
                            first = next(iter(answers))
                        except StopIteration:
                            raise NodeGrpcError("STREAM_ENDED", "the stream ended without a message") from None
                        answers.cancel()
                        return bytes(first)
                    return bytes(
                        channel.unary_unary(method, request_serializer=None, response_deserializer=None)(
                            request, timeout=timeout
                        )
                    )
                except grpc.RpcError as err:
                    raise NodeGrpcError(err.code().name, str(err.details())) from None
        helper = self._helper_image()
        if helper is None:
            raise BackendError(
                f"cannot reach {socket} on node {node}: its /var volume is not readable from this host (or the path is "
                "too long for a socket) and no helper image (python3 + grpcio) is known"
            )
        proc = run(
            [
                "docker",
                "run",
                "--rm",
                "--volumes-from",
                node,
                "--entrypoint",
                "python3",
                helper,
                "-c",
                GRPC_CALL,
                socket,
                method,
                base64.b64encode(request).decode(),
                str(timeout),
                "stream" if stream else "unary",
            ],
            timeout=timeout + 60,
            check=False,
        )
        if proc.returncode != 0:
            raise NodeGrpcError.from_stderr(proc.stderr) or BackendError(
                f"{method} at {socket} on node {node} failed ({proc.returncode}): {proc.stderr.strip()[-1500:]}"
            )
        return base64.b64decode(proc.stdout.strip())
