"""One registered DRA kubelet plugin as the kubelet calls it: NodePrepareResources / NodeUnprepareResources.

Mirrors upstream ``pkg/kubelet/cm/dra/plugin/dra_plugin.go``: one gRPC channel per plugin, made at
registration and connected on demand; the service chosen at registration (``v1.DRAPlugin`` or
``v1beta1.DRAPlugin``, wire-identical messages) decides which method path is called; each call has
the client call timeout (45 s, half the kubelet's retry period). The channel's connectivity is watched
so the plugin manager knows whether the driver is usable (upstream's gRPC stats handler); gRPC keeps
reconnecting on its own, which is how a restarted driver is noticed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import Message

from pytest_devplug.api.dra import v1_pb2 as pb
from pytest_devplug.api.dra import v1_pb2_grpc as pb_grpc
from pytest_devplug.api.dra import v1beta1_pb2 as pb_beta
from pytest_devplug.api.dra import v1beta1_pb2_grpc as pb_beta_grpc
from pytest_devplug.sim.dial import plugin_channel
from pytest_devplug.sim.endpoint import go_rpc_error
from pytest_devplug.errors import DRAPluginCallError

__all__ = [
    "SERVICE_V1",
    "SERVICE_V1BETA1",
    "SERVICES_SUPPORTED_BY_KUBELET",
    "CLIENT_CALL_TIMEOUT_S",
    "CallObserver",
    "DRAPluginClient",
]

SERVICE_V1 = "v1.DRAPlugin"
SERVICE_V1BETA1 = "v1beta1.DRAPlugin"
#: ``servicesSupportedByKubelet``, most recent first.
SERVICES_SUPPORTED_BY_KUBELET = (SERVICE_V1, SERVICE_V1BETA1)
#: ``defaultClientCallTimeout``.
CLIENT_CALL_TIMEOUT_S = 45.0


#: Told of every call's outcome: (driver, method, claim UIDs asked, error text or "" when the call succeeded as
#: a whole; per-claim errors are in the response).
CallObserver = Callable[[str, str, list[str], str], None]


def _claim_errors(response: Message) -> str:
    """The claims a response answered with an error, ``claim <uid>: <error>`` each (``""``: none)."""
    answers = getattr(response, "claims", {})
    return "; ".join(f"claim {uid}: {answers[uid].error}" for uid in sorted(answers) if answers[uid].error)


def _as(message: Message, cls: type[Message]) -> Any:
    # v1 and v1beta1 messages have the same fields and numbers: convert through the wire format
    return cls.FromString(message.SerializeToString())


class DRAPluginClient:
    """The kubelet's handle on one plugin of one driver (``DRAPlugin``)."""

    def __init__(
        self,
        driver_name: str,
        endpoint: Path,
        chosen_service: str,
        *,
        call_timeout: float = CLIENT_CALL_TIMEOUT_S,
        on_connection_change: Callable[[DRAPluginClient, bool], None] | None = None,
        on_call: CallObserver | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        if chosen_service not in SERVICES_SUPPORTED_BY_KUBELET:
            raise ValueError(f"internal error: unsupported chosen service: {chosen_service!r}")
        self.driver_name = driver_name
        self.endpoint = endpoint
        self.chosen_service = chosen_service
        self.call_timeout = call_timeout
        self._log = logger or logging.getLogger(__name__)
        self._on_change = on_connection_change
        self._on_call = on_call
        self._lock = threading.Lock()
        #: Whether the channel is READY now (upstream ``monitoredPlugin.connected``).
        self._connected = False
        self._closed = False
        self.channel: Any = plugin_channel(endpoint)
        stub_module = pb_grpc if chosen_service == SERVICE_V1 else pb_beta_grpc
        self._stub = stub_module.DRAPluginStub(self.channel)
        # try_to_connect: gRPC dials now and again after every drop, as upstream's conn.Connect() does
        self.channel.subscribe(self._connectivity, try_to_connect=True)

    def __repr__(self) -> str:
        return f"DRAPluginClient({self.driver_name!r}, {str(self.endpoint)!r}, {self.chosen_service})"

    @property
    def connected(self) -> bool:
        with self._lock:
            return self._connected

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran: the plugin's deregistration is complete only then."""
        with self._lock:
            return self._closed

    def _connectivity(self, state: grpc.ChannelConnectivity) -> None:
        connected = state == grpc.ChannelConnectivity.READY
        with self._lock:
            if self._closed or connected == self._connected:
                return
            self._connected = connected
        self._log.info(
            "Connection changed driverName=%s endpoint=%s connected=%s", self.driver_name, self.endpoint, connected
        )
        if self._on_change is not None:
            self._on_change(self, connected)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._connected = False
        self.channel.unsubscribe(self._connectivity)
        self.channel.close()

    def _call(self, method: str, request: Message, response_cls: type[Message]) -> Any:
        beta = self.chosen_service == SERVICE_V1BETA1
        if beta:
            request = _as(request, getattr(pb_beta, type(request).__name__))
        self._log.info("Calling %s rpc driverName=%s endpoint=%s", method, self.driver_name, self.endpoint)
        uids = [c.uid for c in getattr(request, "claims", [])]
        try:
            response = getattr(self._stub, method)(request, timeout=self.call_timeout)
        except grpc.RpcError as err:
            self._observe(method, uids, go_rpc_error(err))
            raise DRAPluginCallError(go_rpc_error(err)) from None
        except ValueError:
            # grpcio refuses calls on a closed channel; grpc-go answers a closed ClientConn this way
            if not self._closed:
                raise
            closing = "rpc error: code = Canceled desc = grpc: the client connection is closing"
            self._observe(method, uids, closing)
            raise DRAPluginCallError(closing) from None
        self._observe(method, uids, _claim_errors(response))
        return _as(response, response_cls) if beta else response

    def _observe(self, method: str, uids: list[str], error: str) -> None:
        if self._on_call is not None:
            self._on_call(self.driver_name, method, uids, error)

    def node_prepare_resources(self, claims: Sequence[pb.Claim]) -> pb.NodePrepareResourcesResponse:
        """One NodePrepareResources call for ``claims``; per-claim failures are in the response."""
        resp: pb.NodePrepareResourcesResponse = self._call(
            "NodePrepareResources", pb.NodePrepareResourcesRequest(claims=list(claims)), pb.NodePrepareResourcesResponse
        )
        return resp

    def node_unprepare_resources(self, claims: Sequence[pb.Claim]) -> pb.NodeUnprepareResourcesResponse:
        resp: pb.NodeUnprepareResourcesResponse = self._call(
            "NodeUnprepareResources",
            pb.NodeUnprepareResourcesRequest(claims=list(claims)),
            pb.NodeUnprepareResourcesResponse,
        )
        return resp
