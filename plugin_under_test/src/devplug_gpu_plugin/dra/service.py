"""``NodePrepareResources`` / ``NodeUnprepareResources`` for the kubelet (v1, and v1beta1 on the same code).

Like the Go helper: the claims are read from the API first, outside the lock, and any read or check that
fails fails the whole call (gRPC ``Unknown``, "get resource claims: ..."); then calls are serialized.
Prepare is idempotent: a claim prepared before answers what it answered then (its spec written again),
and after a driver restart the same claim prepares to the same devices and CDI IDs, since both follow
from the claim. Unprepare removes the claim's spec and answers an entry for every claim, prepared or not.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import grpc
from google.protobuf.message import Message

from ..api.dra import v1_pb2 as pb
from ..api.dra import v1_pb2_grpc as pb_grpc
from ..api.dra import v1beta1_pb2 as pb_beta
from ..api.dra import v1beta1_pb2_grpc as pb_beta_grpc
from ..devices import DeviceState
from .cdi import CdiLayout, InvalidClaimUidError, check_uid
from .prepare import ClaimCheckError, ClaimError, PreparedClaim, check_claim, prepare_claim

__all__ = ["ClaimReader", "DraService", "DraServiceV1beta1"]

log = logging.getLogger("devplug_gpu_plugin.dra.service")


class ClaimReader(Protocol):
    """Reads a ResourceClaim from the API server (:class:`~.kubeapi.KubeApi`); raises on failure."""

    def get_claim(self, namespace: str, name: str) -> Mapping[str, Any]: ...


class DraService(pb_grpc.DRAPluginServicer):
    """The ``v1.DRAPlugin`` service of the driver's ``dra.sock``."""

    def __init__(
        self,
        claims: ClaimReader,
        state: DeviceState,
        layout: CdiLayout,
        node: str,
        fault: Callable[[str], str | None] | None = None,
        report: Callable[[Mapping[str, Any], PreparedClaim], object] | None = None,
    ) -> None:
        self.claims = claims
        #: Publishes a prepared claim's device status (``--device-status``); its failure is logged, not the claim's.
        self.report = report
        self.state = state
        self.layout = layout
        self.node = node
        self.fault = fault
        self._lock = threading.Lock()
        #: claim UID -> what it was prepared as (since this process started)
        self._prepared: dict[str, PreparedClaim] = {}

    def _read(self, request: pb.NodePrepareResourcesRequest) -> list[tuple[pb.Claim, Mapping[str, Any]]]:
        out = []
        for ref in request.claims:
            try:
                claim = self.claims.get_claim(ref.namespace, ref.name)
            except Exception as exc:  # noqa: BLE001 - any read failure fails the call, as in the Go helper
                raise ClaimCheckError(f"retrieve claim {ref.namespace}/{ref.name}: {exc}") from None
            check_claim(claim, ref.namespace, ref.name, ref.uid)
            out.append((ref, claim))
        return out

    def _prepare_one(self, claim: Mapping[str, Any]) -> PreparedClaim:
        uid = str((claim.get("metadata") or {}).get("uid", ""))
        check_uid(uid)
        prepared = self._prepared.get(uid)
        if prepared is None:
            prepared = prepare_claim(claim, self.state.snapshot(), self.layout, self.node, self.fault)
        if prepared.spec is not None:
            self.layout.write(uid, prepared.spec)  # again when prepared before: the spec may have been removed
        self._prepared[uid] = prepared
        return prepared

    def NodePrepareResources(
        self, request: pb.NodePrepareResourcesRequest, context: Any
    ) -> pb.NodePrepareResourcesResponse:
        try:
            claims = self._read(request)
        except ClaimCheckError as exc:
            log.error("NodePrepareResources: get resource claims: %s", exc)
            context.abort(grpc.StatusCode.UNKNOWN, f"get resource claims: {exc}")
        resp = pb.NodePrepareResourcesResponse()
        with self._lock:
            for ref, claim in claims:
                entry = resp.claims[ref.uid]
                try:
                    prepared = self._prepare_one(claim)
                except (ClaimError, InvalidClaimUidError, OSError) as exc:
                    entry.error = str(exc)
                    log.error("NodePrepareResources: %s/%s: %s", ref.namespace, ref.name, exc)
                    continue
                if self.report is not None:
                    try:
                        self.report(claim, prepared)
                    except Exception as exc:  # noqa: BLE001 - the devices are prepared; only their status is missing
                        log.error(
                            "NodePrepareResources: %s/%s: device status not written: %s", ref.namespace, ref.name, exc
                        )
                for d in prepared.devices:
                    entry.devices.add(
                        request_names=[d.request],
                        pool_name=d.pool,
                        device_name=d.device,
                        cdi_device_ids=list(d.cdi_ids),
                    )
                log.info(
                    "NodePrepareResources: claim %s/%s (%s): %s",
                    ref.namespace,
                    ref.name,
                    ref.uid,
                    ", ".join(d.device for d in prepared.devices) or "no device of this driver",
                )
        return resp

    def NodeUnprepareResources(
        self, request: pb.NodeUnprepareResourcesRequest, context: Any
    ) -> pb.NodeUnprepareResourcesResponse:
        resp = pb.NodeUnprepareResourcesResponse()
        with self._lock:
            for ref in request.claims:
                entry = resp.claims[ref.uid]
                try:
                    removed = self.layout.remove(ref.uid)
                except (InvalidClaimUidError, OSError) as exc:
                    entry.error = f"claim {ref.namespace}/{ref.name}: {exc}"
                    log.error("NodeUnprepareResources: %s", entry.error)
                    continue
                self._prepared.pop(ref.uid, None)
                log.info(
                    "NodeUnprepareResources: claim %s/%s (%s)%s",
                    ref.namespace,
                    ref.name,
                    ref.uid,
                    "" if removed else ": was not prepared",
                )
        return resp


def _as(message: Message, cls: type[Message]) -> Any:
    # v1 and v1beta1 messages have the same fields and numbers: convert through the wire format
    return cls.FromString(message.SerializeToString())


class DraServiceV1beta1(pb_beta_grpc.DRAPluginServicer):
    """``v1beta1.DRAPlugin``: the same calls as :class:`DraService` (wire-identical messages)."""

    def __init__(self, v1: DraService) -> None:
        self.v1 = v1

    def NodePrepareResources(self, request: Message, context: Any) -> Any:
        resp = self.v1.NodePrepareResources(_as(request, pb.NodePrepareResourcesRequest), context)
        return _as(resp, pb_beta.NodePrepareResourcesResponse)

    def NodeUnprepareResources(self, request: Message, context: Any) -> Any:
        resp = self.v1.NodeUnprepareResources(_as(request, pb.NodeUnprepareResourcesRequest), context)
        return _as(resp, pb_beta.NodeUnprepareResourcesResponse)
