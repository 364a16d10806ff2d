"""Small fake DRA drivers for the DRA-layer tests: real gRPC over Unix sockets, behaviour set per test.

A :class:`FakeDriver` serves ``pluginregistration.Registration`` on ``<registry>/<driver>-reg.sock``
and the DRA services (v1 and/or v1beta1 ``DRAPlugin``, optionally ``DRAResourceHealth``) on its own
socket or, with ``endpoint=""``, on the registration socket. It records every call so tests assert on
what the kubelet side sent.
"""

from __future__ import annotations

import queue
import shutil
import tempfile
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from pytest_devplug.api.dra import v1_pb2, v1_pb2_grpc, v1beta1_pb2, v1beta1_pb2_grpc
from pytest_devplug.api.drahealth import v1_pb2 as hpb1
from pytest_devplug.api.drahealth import v1_pb2_grpc as hpb1_grpc
from pytest_devplug.api.drahealth import v1alpha1_pb2 as hpb
from pytest_devplug.api.drahealth import v1alpha1_pb2_grpc as hpb_grpc
from pytest_devplug.api.pluginregistration import v1_pb2 as rpb
from pytest_devplug.api.pluginregistration import v1_pb2_grpc as rpb_grpc

_END = object()


@dataclass
class Calls:
    """What the kubelet side asked, in order."""

    get_info: int = 0
    statuses: list[tuple[bool, str]] = field(default_factory=list)
    #: (service version, method, claim uids)
    dra: list[tuple[str, str, list[str]]] = field(default_factory=list)
    health_streams: int = 0
    #: The version of each health stream opened ("v1", "v1alpha1").
    health_services: list[str] = field(default_factory=list)


class FakeDriver:
    def __init__(
        self,
        root: Path,
        name: str = "gpu.example.com",
        *,
        versions: tuple[str, ...] = ("v1.DRAPlugin", "v1beta1.DRAPlugin"),
        serve: tuple[str, ...] = ("v1", "v1beta1"),
        endpoint: str | None = None,
        plugin_type: str = "DRAPlugin",
        health: bool = False,
        health_versions: tuple[str, ...] = ("v1alpha1",),
        list_health: bool = True,
    ) -> None:
        self.root = root
        self.name = name
        # A driver that serves health lists its services in GetInfo (the kubeletplugin helper does; from 1.37 the
        # kubelet watches only a listed one); ``list_health=False`` makes one that serves health but lists none.
        listed = tuple(f"{v}.DRAResourceHealth" for v in health_versions) if health and list_health else ()
        self.versions = (*versions, *(v for v in listed if v not in versions))
        self.health_versions = health_versions
        self.plugin_type = plugin_type
        self.calls = Calls()
        self.reg_socket = root / "plugins_registry" / f"{name}-reg.sock"
        self.dra_socket = self.reg_socket if endpoint == "" else root / "plugins" / name / "dra.sock"
        self.endpoint = str(self.dra_socket) if endpoint is None else endpoint
        #: claim uid -> devices this driver hands out for it
        self.devices: dict[str, list[v1_pb2.Device]] = {}
        #: claim uid -> per-claim error to answer
        self.claim_errors: dict[str, str] = {}
        #: Claims left out of the response (answered with nothing).
        self.skip: set[str] = set()
        #: claim uid -> per-claim error NodeUnprepareResources answers
        self.unprepare_errors: dict[str, str] = {}
        #: Cleared: NodePrepareResources waits until it is set again (a driver stuck preparing).
        self.prepare_gate = threading.Event()
        self.prepare_gate.set()
        #: Fail GetInfo this many times before answering.
        self.get_info_failures = 0
        #: Fail NotifyRegistrationStatus(true) this many times.
        self.notify_failures = 0
        self.prepared: set[str] = set()
        self.health_updates: queue.Queue[Any] = queue.Queue()
        self.registered = threading.Event()
        self._serve = serve
        self._health = health
        self._servers: list[Any] = []
        self._lock = threading.Lock()

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> FakeDriver:
        self.reg_socket.parent.mkdir(parents=True, exist_ok=True)
        self.dra_socket.parent.mkdir(parents=True, exist_ok=True)
        dra = self._server()
        self._add_dra(dra)
        if self.dra_socket != self.reg_socket:
            dra.add_insecure_port(f"unix://{self.dra_socket}")
            dra.start()
            self._servers.append(dra)
            reg = self._server()
        else:
            reg = dra
        rpb_grpc.add_RegistrationServicer_to_server(_Registration(self), reg)  # type: ignore[no-untyped-call]
        # the registration socket last, as kubeletplugin does: once it exists the kubelet may dial it
        reg.add_insecure_port(f"unix://{self.reg_socket}")
        reg.start()
        self._servers.append(reg)
        return self

    def stop(self) -> None:
        self.health_updates.put(_END)
        for s in self._servers:
            s.stop(grace=None).wait(5)
        self._servers.clear()
        self.reg_socket.unlink(missing_ok=True)
        self.dra_socket.unlink(missing_ok=True)

    def _server(self) -> Any:
        return grpc.server(futures.ThreadPoolExecutor(max_workers=8))

    def _add_dra(self, server: Any) -> None:
        if "v1" in self._serve:
            v1_pb2_grpc.add_DRAPluginServicer_to_server(_DRA(self, "v1", v1_pb2), server)  # type: ignore[no-untyped-call]
        if "v1beta1" in self._serve:
            v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(_DRA(self, "v1beta1", v1beta1_pb2), server)  # type: ignore[no-untyped-call]
        if self._health and "v1alpha1" in self.health_versions:
            hpb_grpc.add_DRAResourceHealthServicer_to_server(_Health(self, "v1alpha1"), server)  # type: ignore[no-untyped-call]
        if self._health and "v1" in self.health_versions:
            hpb1_grpc.add_DRAResourceHealthServicer_to_server(_Health(self, "v1"), server)  # type: ignore[no-untyped-call]

    # --- health ---------------------------------------------------------------------------------

    def send_health(self, *devices: tuple[str, str, int] | tuple[str, str, int, str]) -> None:
        """One stream message: (pool, device, HealthStatus[, message]) each."""
        self.health_updates.put(
            hpb.NodeWatchResourcesResponse(
                devices=[
                    hpb.DeviceHealth(
                        device=hpb.DeviceIdentifier(pool_name=d[0], device_name=d[1]),
                        health=d[2],
                        last_updated_time=1,
                        message=d[3] if len(d) > 3 else "",
                    )  # type: ignore[misc]
                    for d in devices
                ]
            )
        )

    def end_health_stream(self) -> None:
        self.health_updates.put(_END)


class _Registration(rpb_grpc.RegistrationServicer):
    def __init__(self, driver: FakeDriver) -> None:
        self.d = driver

    def GetInfo(self, request: Any, context: Any) -> Any:  # noqa: N802
        with self.d._lock:
            self.d.calls.get_info += 1
            if self.d.get_info_failures > 0:
                self.d.get_info_failures -= 1
                context.abort(grpc.StatusCode.UNAVAILABLE, "not ready yet")
        return rpb.PluginInfo(
            type=self.d.plugin_type, name=self.d.name, endpoint=self.d.endpoint, supported_versions=self.d.versions
        )

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:  # noqa: N802
        with self.d._lock:
            self.d.calls.statuses.append((request.plugin_registered, request.error))
            if request.plugin_registered and self.d.notify_failures > 0:
                self.d.notify_failures -= 1
                context.abort(grpc.StatusCode.UNAVAILABLE, "not listening yet")
        if request.plugin_registered:
            self.d.registered.set()
        return rpb.RegistrationStatusResponse()


class _DRA:
    """A DRAPlugin servicer for one version; prepare and unprepare are idempotent."""

    def __init__(self, driver: FakeDriver, version: str, module: Any) -> None:
        self.d, self.version, self.pb = driver, version, module

    def NodePrepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.d.prepare_gate.wait(30)
        with self.d._lock:
            uids = [c.uid for c in request.claims]
            self.d.calls.dra.append((self.version, "prepare", uids))
            resp = self.pb.NodePrepareResourcesResponse()
            for uid in uids:
                if uid in self.d.skip:
                    continue
                if uid in self.d.claim_errors:
                    resp.claims[uid].error = self.d.claim_errors[uid]
                    continue
                self.d.prepared.add(uid)
                for dev in self.d.devices.get(uid, []):
                    resp.claims[uid].devices.add().ParseFromString(dev.SerializeToString())
                resp.claims[uid].SetInParent()
            return resp

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802
        with self.d._lock:
            uids = [c.uid for c in request.claims]
            self.d.calls.dra.append((self.version, "unprepare", uids))
            resp = self.pb.NodeUnprepareResourcesResponse()
            for uid in uids:
                if uid in self.d.unprepare_errors:
                    resp.claims[uid].error = self.d.unprepare_errors[uid]
                    continue
                self.d.prepared.discard(uid)
                resp.claims[uid].SetInParent()
            return resp


class _Health:
    """``NodeWatchResources`` of one version; the messages queued (v1alpha1's) go out in that version's type."""

    def __init__(self, driver: FakeDriver, version: str) -> None:
        self.d, self.version = driver, version

    def NodeWatchResources(self, request: Any, context: Any) -> Iterator[Any]:  # noqa: N802
        with self.d._lock:
            self.d.calls.health_streams += 1
            self.d.calls.health_services.append(self.version)
        while context.is_active():
            try:
                item = self.d.health_updates.get(timeout=0.1)
            except queue.Empty:
                continue
            if item is _END:
                return
            yield hpb1.NodeWatchResourcesResponse.FromString(item.SerializeToString()) if self.version == "v1" else item


def device(pool: str, name: str, *cdi: str, requests: tuple[str, ...] = ()) -> v1_pb2.Device:
    return v1_pb2.Device(pool_name=pool, device_name=name, cdi_device_ids=list(cdi), request_names=list(requests))


class FakeClaims:
    """A ClaimSource over a dict; ``claim()`` makes allocated claims reserved for given pods."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}

    def get_resource_claim(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            return self.claims[(namespace, name)]
        except KeyError:
            raise LookupError(f'resourceclaims.resource.k8s.io "{name}" not found') from None

    def claim(
        self,
        name: str,
        uid: str,
        driver: str,
        *pods: dict[str, Any],
        namespace: str = "default",
        allocated: bool = True,
        owner: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        status: dict[str, Any] = {
            "reservedFor": [
                {"resource": "pods", "name": p["metadata"]["name"], "uid": p["metadata"]["uid"]} for p in pods
            ]
        }
        if allocated:
            status["allocation"] = {
                "devices": {"results": [{"request": "gpu", "driver": driver, "pool": "node-1", "device": "gpu-0"}]}
            }
        meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid}
        if owner is not None:
            meta["ownerReferences"] = [
                {"kind": "Pod", "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"], "controller": True}
            ]
        self.claims[(namespace, name)] = {"metadata": meta, "status": status}
        return self.claims[(namespace, name)]


def pod(name: str, uid: str, *claims: str, namespace: str = "default", request: str = "") -> dict[str, Any]:
    """A pod whose one container uses each named ResourceClaim (pod claim name = claim name)."""
    ref = [{"name": c, **({"request": request} if request else {})} for c in claims]
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {
            "resourceClaims": [{"name": c, "resourceClaimName": c} for c in claims],
            "containers": [{"name": "ctr", "resources": {"claims": ref}}],
        },
    }


class FakeWiper:
    """A ResourceSliceWiper that records calls; ``fail`` makes the next calls raise."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None]] = []
        self.fail = 0
        self._lock = threading.Lock()

    def delete_resource_slices(self, node_name: str, driver: str | None) -> None:
        with self._lock:
            self.calls.append((node_name, driver))
            if self.fail > 0:
                self.fail -= 1
                raise ConnectionError("apiserver not reachable")


def short_root(prefix: str = "dra-") -> Path:
    """A short temp dir (Unix socket paths must stay under 108 bytes)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def remove_root(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
