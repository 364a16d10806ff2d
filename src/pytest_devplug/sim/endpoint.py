"""One registered device plugin as the kubelet's device manager sees it.

Mirrors upstream ``endpoint.go`` + ``plugin/v1beta1/client.go``: a gRPC connection to the plugin's
socket, the options it answered, its ListAndWatch stream (read in a thread) and the RPCs the
device manager issues. A *stopped* endpoint (after a kubelet restart, or once its stream ended)
has a stop time; the device manager removes it once the grace period has passed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc


from pytest_devplug.api.deviceplugin import v1beta1_pb2 as pb
from pytest_devplug.api.deviceplugin import v1beta1_pb2_grpc as pb_grpc
from pytest_devplug.errors import EndpointError
from pytest_devplug.sim.dial import plugin_channel

__all__ = ["Endpoint", "go_rpc_error", "DIAL_TIMEOUT_S", "PRE_START_TIMEOUT_S"]

#: upstream ``dial``: ``context.WithTimeout(..., 10*time.Second)`` with ``grpc.WithBlock()``.
DIAL_TIMEOUT_S = 10.0
#: ``KubeletPreStartContainerRPCTimeoutInSecs``.
PRE_START_TIMEOUT_S = 30.0
#: Upstream sends GetDevicePluginOptions/Allocate without a deadline; a test harness must not hang
#: forever on a wedged plugin, so these RPCs get a generous bound instead.
RPC_TIMEOUT_S = 60.0

_GO_CODE_NAMES = {"CANCELLED": "Canceled", "OK": "OK"}


def go_rpc_error(err: grpc.RpcError) -> str:
    """Render a gRPC error as grpc-go's ``status.Error`` prints it (what kubelet messages embed)."""
    code = err.code() if hasattr(err, "code") else None
    details = err.details() if hasattr(err, "details") else str(err)
    if code is None:
        return f"rpc error: code = Unknown desc = {details}"
    name = code.name
    go_name = _GO_CODE_NAMES.get(name) or "".join(p.capitalize() for p in name.split("_"))
    return f"rpc error: code = {go_name} desc = {details}"


class Endpoint:
    """A connection to one plugin (or a stopped placeholder restored from the checkpoint)."""

    def __init__(
        self,
        resource_name: str,
        socket_path: Path | None,
        *,
        logger: logging.Logger | None = None,
    ) -> None:
        self.resource_name = resource_name
        self.socket_path = socket_path
        self.options: pb.DevicePluginOptions | None = None
        self._log = logger or logging.getLogger(__name__)
        self._mutex = threading.Lock()
        self._stop_time: float | None = None
        self._channel: Any = None
        self._stub: Any = None
        self._stream: Any = None
        self._closed = False
        self._thread: threading.Thread | None = None

    @classmethod
    def stopped(cls, resource_name: str, logger: logging.Logger | None = None) -> Endpoint:
        """``newStoppedEndpointImpl``: a placeholder whose grace period starts now."""
        e = cls(resource_name, None, logger=logger)
        e._stop_time = time.monotonic()
        e._closed = True
        return e

    def __repr__(self) -> str:
        return f"Endpoint({self.resource_name!r}, {str(self.socket_path)!r}, stopped={self.is_stopped()})"

    # --- stop time / grace ------------------------------------------------------------------

    def set_stop_time(self, t: float) -> None:
        with self._mutex:
            self._stop_time = t

    def stop_time(self) -> float | None:
        with self._mutex:
            return self._stop_time

    def is_stopped(self) -> bool:
        with self._mutex:
            return self._stop_time is not None

    @property
    def is_closed(self) -> bool:
        """Whether the kubelet closed its side (:meth:`close`): its stream's messages no longer count."""
        return self._closed

    def grace_expired(self, grace_period: float) -> bool:
        with self._mutex:
            return self._stop_time is not None and time.monotonic() - self._stop_time > grace_period

    # --- connection ---------------------------------------------------------------------------

    def connect(self, timeout: float = DIAL_TIMEOUT_S) -> None:
        """Dial the plugin socket and wait until the channel is ready (``grpc.WithBlock``)."""
        assert self.socket_path is not None
        channel = plugin_channel(self.socket_path)
        try:
            grpc.channel_ready_future(channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            channel.close()
            raise EndpointError("failed to dial device plugin: context deadline exceeded") from None
        self._channel = channel
        self._stub = pb_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]

    def get_options(self) -> pb.DevicePluginOptions:
        """GetDevicePluginOptions; a failure means the plugin is not registered (upstream PluginConnected)."""
        try:
            opts: pb.DevicePluginOptions = self._stub.GetDevicePluginOptions(pb.Empty(), timeout=RPC_TIMEOUT_S)
        except grpc.RpcError as err:
            raise EndpointError(f"failed to get device plugin options: {go_rpc_error(err)}") from None
        self.options = opts
        return opts

    def run(
        self,
        on_response: Callable[[Endpoint, pb.ListAndWatchResponse], None],
        on_end: Callable[[Endpoint], None],
    ) -> None:
        """Open ListAndWatch and read it in a daemon thread; ``on_end`` runs once when the stream
        ends for any reason other than :meth:`close` (the kubelet never re-dials)."""
        self._stream = self._stub.ListAndWatch(pb.Empty())

        def reader() -> None:
            try:
                for resp in self._stream:
                    if self._closed:
                        return
                    self._log.info(
                        "State pushed for device plugin %s: %d devices", self.resource_name, len(resp.devices)
                    )
                    on_response(self, resp)
                # The server returned: a Go client's Recv() gives io.EOF, which upstream logs as the error.
                self._log.warning("ListAndWatch ended unexpectedly for device plugin %s: EOF", self.resource_name)
            except grpc.RpcError as err:
                if not self._closed:
                    self._log.warning(
                        "ListAndWatch ended unexpectedly for device plugin %s: %s",
                        self.resource_name,
                        go_rpc_error(err),
                    )
            if not self._closed:
                on_end(self)

        self._thread = threading.Thread(target=reader, name=f"listandwatch-{self.resource_name}", daemon=True)
        self._thread.start()

    def ignore_stream(self) -> None:
        """Count none of its stream's messages from now on, as a closed connection delivers none: the device
        manager calls it under its lock while it disconnects the endpoint, whose :meth:`close` (which waits for the
        stream's reader) comes after the lock is released."""
        self._closed = True

    def close(self) -> None:
        """Cancel the stream and close the channel; ``on_end`` will not be called afterwards."""
        self._closed = True
        if self._stream is not None:
            self._stream.cancel()
        if self._channel is not None:
            self._channel.close()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=5.0)

    # --- RPCs -------------------------------------------------------------------------------

    def _check_running(self) -> None:
        if self.is_stopped() or self._stub is None:
            raise EndpointError(f"endpoint {self.resource_name} has been stopped")

    def get_preferred_allocation(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> pb.PreferredAllocationResponse:
        self._check_running()
        req = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=list(available), must_include_deviceIDs=list(must_include), allocation_size=size
                )
            ]
        )
        try:
            resp: pb.PreferredAllocationResponse = self._stub.GetPreferredAllocation(req, timeout=RPC_TIMEOUT_S)
        except grpc.RpcError as err:
            raise EndpointError(
                f"device plugin GetPreferredAllocation rpc failed with err: {go_rpc_error(err)}"
            ) from None
        return resp

    def allocate(self, devices: Sequence[str]) -> pb.AllocateResponse:
        self._check_running()
        req = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=list(devices))])
        try:
            resp: pb.AllocateResponse = self._stub.Allocate(req, timeout=RPC_TIMEOUT_S)
        except grpc.RpcError as err:
            raise EndpointError(go_rpc_error(err)) from None
        return resp

    def pre_start_container(self, devices: Sequence[str]) -> pb.PreStartContainerResponse:
        self._check_running()
        try:
            resp: pb.PreStartContainerResponse = self._stub.PreStartContainer(
                pb.PreStartContainerRequest(devices_ids=list(devices)), timeout=PRE_START_TIMEOUT_S
            )
        except grpc.RpcError as err:
            raise EndpointError(f"device plugin PreStartContainer rpc failed with err: {go_rpc_error(err)}") from None
        return resp
