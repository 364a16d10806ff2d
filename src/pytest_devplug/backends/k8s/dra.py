"""The DRA side of a real cluster (:class:`~pytest_devplug.backends.dra.DRABackend` on :class:`~.backend.KubeBackend`):
the driver as a DaemonSet of the run, the kubelet's view from its journal and files.

- **The driver** is deployed from its manifest (:mod:`.dramanifests`: ServiceAccount, RBAC, DaemonSet), pinned to
  the node (tolerating its taints, as the checks' pods do), and stopped, killed and started as the device plugin
  is (:mod:`.daemonsets`: the DaemonSet stops selecting the node; a kill force-deletes the pod, SIGKILL, sockets
  left behind). Its log is its pods' logs.
- **The kubelet's view**: what it registered, its connections and its NodePrepareResources /
  NodeUnprepareResources calls from its journal (:mod:`.dralog`; the kubelet must log ``dra_plugin.go`` and
  ``dra_plugin_manager.go`` at level 4: set here through ``logging.vmodule`` where the node's kubelet config lacks
  it, restored at the end), ``dra_manager_state`` read from the node, the driver's own sockets called through the
  node transport (as the kubelet calls them).
- **What a real kubelet cannot do** raises ``UnsupportedOperationError`` saying why: refuse a registration on
  purpose, shorten its DRA periods (constants: wiping 30 s, pod-worker back-off 10 s, reconcile 60 s;
  :meth:`KubeDRA.dra_timings` says them, so checks wait them out).
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import yaml

from ...api.dra import v1_pb2 as pb
from ...api.dra import v1beta1_pb2 as pb_beta
from ...api.drahealth import v1_pb2 as hpb1
from ...api.drahealth import v1alpha1_pb2 as hpb
from ...api.pluginregistration import v1_pb2 as rpb
from ...kuberest import KubeRest
from ...errors import BackendError, BackendUnavailableError, NodeGrpcError, RestError, UnsupportedOperationError
from ...kubeletmodel import cdi
from ...kubeletmodel.periods import DRA_RECONCILE_PERIOD_S, DRA_WIPING_DELAY_S, POD_BACKOFF_PERIOD_S
from .. import mockstate
from ..base import BackendOptions, PluginSpec, node_tolerations
from ..dra import DRACallRecord, DriverSpec, RegistrationRecord
from .daemonsets import PinnedDaemonSets, container_statuses, exit_reason, pods_running, restarts
from .dralog import VMODULE, KubeletDRAState, read_into, read_script
from .api import KubeApi
from .dramanifests import COLLECTIONS, DRA_MOCK_STATE_PATH, render_driver
from .nodeops import NodeOps
from .ownership import MANAGED_BY

__all__ = ["DRA_CHECKPOINT_PATH", "KUBELET_DRA_TIMINGS", "DriverImages", "KubeDRA", "KubeDRAHost", "go_duration_s"]

T = TypeVar("T")

#: The kubelet's DRA checkpoint (``<root dir>/dra_manager_state``).
DRA_CHECKPOINT_PATH = "/var/lib/kubelet/dra_manager_state"
#: The real kubelet's DRA periods, constants of 1.34: ``defaultWipingDelay``, ``defaultReconcilePeriod`` and the
#: pod workers' ``backOffPeriod`` (a failed unprepare is an error of the pod's sync: retried after it). A failed
#: prepare is no error of the sync (``SyncPod`` records an event and returns), so its retry waits for the pod's
#: next resync: ``syncFrequency`` of the kubelet config (1 min by default), which :meth:`KubeDRA.dra_timings` reads.
KUBELET_DRA_TIMINGS = {
    "wiping_delay": DRA_WIPING_DELAY_S,
    "retry_period": POD_BACKOFF_PERIOD_S,
    "reconcile_period": DRA_RECONCILE_PERIOD_S,
}
#: ``syncFrequency`` when the kubelet config does not set it.
DEFAULT_SYNC_FREQUENCY_S = 60.0
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def go_duration_s(text: str) -> float:
    """A Go duration (``1m0s``, ``10s``, ``1.5s``) in seconds."""
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        raise ValueError(f"not a Go duration: {text!r}")
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


#: The kubelet's name of a DRA service (registration, ``chosenService``) -> its messages and gRPC service.
_SERVICES = {
    "v1.DRAPlugin": (pb, pb.DESCRIPTOR.services_by_name["DRAPlugin"].full_name),
    "v1beta1.DRAPlugin": (pb_beta, pb_beta.DESCRIPTOR.services_by_name["DRAPlugin"].full_name),
}
#: The kubelet's name of a health service -> the method of its stream (the messages are the same in both).
_HEALTH_METHODS = {
    f"{m.DESCRIPTOR.package}.DRAResourceHealth": (
        f"/{m.DESCRIPTOR.services_by_name['DRAResourceHealth'].full_name}/NodeWatchResources"
    )
    for m in (hpb, hpb1)
}
_GET_INFO = f"/{rpb.DESCRIPTOR.services_by_name['Registration'].full_name}/GetInfo"
#: Where drivers put their registration sockets on a node.
PLUGINS_REGISTRY = "/var/lib/kubelet/plugins_registry"


@dataclass
class _Driver:
    spec: DriverSpec
    workload: PinnedDaemonSets
    #: stop_driver or kill_driver and no start_driver since
    stopped: bool = False


class _Journal:
    """One node's kubelet journal, read on from where the last read ended."""

    def __init__(self, since: float) -> None:
        self.state = KubeletDRAState(since=since)
        self.cursor: str | None = None
        self.pid = 0

    def _keep_cursor(self, cursor: str) -> None:
        self.cursor = cursor


class DriverImages(Protocol):
    """What :class:`KubeDRA` asks of the cluster provider: the driver's image and how its pods reach the API."""

    @property
    def routes_services(self) -> bool: ...

    def plugin_image(self, spec: PluginSpec, node: str) -> str: ...


class KubeDRAHost(Protocol):
    """What :class:`KubeDRA` needs of its :class:`~.backend.KubeBackend`, and no more: as the kubelet's DRA manager
    is handed narrow functions (``kubeClient``, ``getNode``, ``activePods``), not the kubelet."""

    @property
    def options(self) -> BackendOptions: ...

    @property
    def provider(self) -> DriverImages: ...

    @property
    def namespace(self) -> str:
        """The run's namespace: the driver's DaemonSet and RBAC go there."""

    @property
    def pod_namespace(self) -> str: ...

    @property
    def api(self) -> KubeApi: ...

    @property
    def nodeops(self) -> NodeOps: ...

    def get_node(self, name: str) -> dict[str, Any]: ...

    def events(self, *, namespace: str | None = None, involved_name: str | None = None) -> list[dict[str, Any]]: ...

    def note_node_image(self, image: str | None) -> None: ...

    def prepare_mock_node(self, node: str, state: dict[str, Any], state_path: str) -> None: ...

    def pinned_daemonsets(self, node: str, daemonsets: list[dict[str, Any]]) -> PinnedDaemonSets: ...

    def reconfigure_kubelet(self, node: str, text: str) -> None: ...

    def wait_until(
        self, probe: Callable[[], T], ok: Callable[[T], bool], what: str, timeout: float | None = None
    ) -> T: ...


class KubeDRA:
    """DRA drivers on the nodes of one started :class:`~.backend.KubeBackend`."""

    def __init__(self, backend: KubeDRAHost) -> None:
        self._b = backend
        self.rest = KubeRest(backend.api.client, max(backend.options.timeout, 10.0))
        self._drivers: dict[str, _Driver] = {}
        self._journals: dict[str, _Journal] = {}
        self._rbac: set[str] = set()
        #: node -> its kubelet config before the DRA log levels were added (restored by close())
        self._config_saved: dict[str, str] = {}
        #: node -> its kubelet's syncFrequency (s), read with its config
        self._sync_s: dict[str, float] = {}

    def close(self) -> list[str]:
        """Remove the drivers and give the kubelets their configs back; the errors, one per thing left."""
        errors = []
        for node in list(self._drivers):
            try:
                self.remove_driver(node)
            except Exception as exc:  # noqa: BLE001 - keep tearing down, report at the end
                errors.append(f"removing the DRA driver on {node}: {exc}")
        for node, text in sorted(self._config_saved.items()):
            try:
                self._b.reconfigure_kubelet(node, text)
                del self._config_saved[node]
            except BackendError as exc:
                errors.append(f"restoring the kubelet config of {node}: {exc}")
        return errors

    # -- the driver ----------------------------------------------------------------------------------
    def _driver(self, node: str) -> _Driver:
        try:
            return self._drivers[node]
        except KeyError:
            raise BackendError(f"no DRA driver deployed on node {node}") from None

    def _api_endpoint(self) -> tuple[str, int] | None:
        """Where pods reach the API server on a cluster that routes no Service IPs (the ``kubernetes`` Endpoints)."""
        if self._b.provider.routes_services:
            return None
        try:
            ep = self.rest.get("/api/v1/namespaces/default/endpoints/kubernetes")
        except RestError as exc:
            raise BackendUnavailableError(
                f"cannot read the API server's endpoint (endpoints/kubernetes): {exc}"
            ) from None
        for subset in ep.get("subsets") or []:
            ports = [p for p in subset.get("ports") or [] if p.get("name") in ("https", None)]
            for address in subset.get("addresses") or []:
                if ports:
                    return str(address["ip"]), int(ports[0]["port"])
        raise BackendUnavailableError(
            f"the kubernetes Service has no endpoint to point the driver's pods at: {ep.get('subsets')}"
        )

    def _create_rbac(self, objects: list[dict[str, Any]]) -> None:
        ns = self._b.namespace
        for obj in objects:
            path = f"{COLLECTIONS[obj['kind']].format(ns=ns)}/{obj['metadata']['name']}"
            if path in self._rbac:
                continue
            try:
                self.rest.create(COLLECTIONS[obj["kind"]].format(ns=ns), obj)
            except RestError as exc:
                if exc.status != 409:
                    raise BackendError(
                        f"creating the DRA driver's {obj['kind']} {obj['metadata']['name']}: {exc}"
                    ) from None
            self._rbac.add(path)

    def deploy_driver(self, node: str, spec: DriverSpec) -> None:
        if node in self._drivers:
            raise BackendError(f"a DRA driver is already deployed on {node}; remove it first")
        self._ensure_dra_logging(node)
        self._journal(node)  # events and calls from now on
        image: str | None = None
        if spec.image or spec.manifest is None:  # the included driver: its image, built and loaded like the plugin's
            image = self._b.provider.plugin_image(PluginSpec(image=spec.image), node)
            self._b.note_node_image(image)
        if spec.mock:
            self._b.prepare_mock_node(
                node, mockstate.initial_state(spec.gpus, spec.numa_nodes, spec.mig, spec.gpu_model), DRA_MOCK_STATE_PATH
            )
        ns = self._b.namespace
        uid = str(self.rest.get(f"/api/v1/namespaces/{ns}")["metadata"]["uid"])
        objects = render_driver(
            spec,
            image,
            namespace=ns,
            namespace_uid=uid,
            node=node,
            labels={MANAGED_BY[0]: MANAGED_BY[1]},
            api_endpoint=self._api_endpoint(),
            tolerations=node_tolerations(self._b.get_node(node)),
        )
        self._create_rbac(objects.rbac)
        workload = self._b.pinned_daemonsets(node, objects.daemonsets)
        workload.apply()
        self._drivers[node] = _Driver(spec, workload)

    def remove_driver(self, node: str) -> None:
        d = self._drivers.pop(node, None)
        if d is None:
            return
        try:
            d.workload.snapshot_logs()
        except BackendError:
            pass
        d.workload.delete()
        d.workload.wait_no_pods(f"DRA driver pods on {node} gone after deleting the DaemonSet")

    def _wait_gone(self, node: str, driver: str) -> None:
        self._b.wait_until(
            lambda: self.driver_usable(node, driver),
            lambda usable: not usable,
            f"the kubelet on {node} seeing DRA driver {driver} go (its journal: connection or registration ended)",
        )

    def stop_driver(self, node: str) -> None:
        d = self._driver(node)
        d.workload.snapshot_logs()
        d.workload.set_stopped(True)
        d.stopped = True
        d.workload.wait_no_pods(f"DRA driver pod on {node} terminated")
        self._wait_gone(node, d.spec.driver_name)

    def kill_driver(self, node: str) -> None:
        d = self._driver(node)
        d.workload.snapshot_logs()
        d.stopped = True
        d.workload.force_remove_pods("DRA driver pod killed")
        self._wait_gone(node, d.spec.driver_name)

    def start_driver(self, node: str) -> None:
        d = self._driver(node)
        d.workload.set_stopped(False)
        d.stopped = False

    def driver_running(self, node: str) -> bool:
        d = self._drivers.get(node)
        return d is not None and pods_running(d.workload.pods())

    def driver_exit(self, node: str) -> str | None:
        """A driver container the kubelet keeps failing to run (it will not come up by itself), or the DaemonSet kept
        off the node by ``stop_driver``/``kill_driver``; ``None`` while it runs or is coming up."""
        d = self._drivers.get(node)
        if d is None:
            return None
        if d.stopped:
            return "stopped: its DaemonSet does not select the node (stop_driver or kill_driver)"
        return exit_reason(container_statuses(d.workload.pods()))

    def driver_restarts(self, node: str) -> int:
        return restarts(container_statuses(self._driver(node).workload.pods())).count

    def driver_log(self, node: str) -> str:
        return self._driver(node).workload.log("DRA driver")

    # -- the kubelet's view --------------------------------------------------------------------------
    def _ensure_dra_logging(self, node: str) -> None:
        """The kubelet logs ``dra_plugin.go`` and ``dra_plugin_manager.go`` at level 4 (``logging.vmodule``), in
        text."""
        if node in self._sync_s:
            return
        try:
            text = self._b.nodeops.kubelet_config(node)
        except BackendError as exc:
            raise UnsupportedOperationError(
                f"the kubelet's DRA calls are read from its journal at -v=4 for two files, set in its config: {exc}"
            ) from None
        config = yaml.safe_load(text) or {}
        try:
            self._sync_s[node] = (
                go_duration_s(str(config["syncFrequency"])) if config.get("syncFrequency") else DEFAULT_SYNC_FREQUENCY_S
            )
        except ValueError as exc:
            raise BackendError(f"the kubelet config of {node}: syncFrequency: {exc}") from None
        logging = config.setdefault("logging", {}) or {}
        if logging.get("format", "text") != "text":
            raise UnsupportedOperationError(
                f"the kubelet of {node} logs as {logging['format']}; its DRA calls are read from its text log lines"
            )
        have = {str(v.get("filePattern")): int(v.get("verbosity", 0)) for v in logging.get("vmodule") or []}
        if int(logging.get("verbosity", 0)) >= 4 or all(have.get(f, 0) >= level for f, level in VMODULE):
            return
        for pattern, level in VMODULE:
            have[pattern] = max(have.get(pattern, 0), level)
        logging["vmodule"] = [{"filePattern": f, "verbosity": v} for f, v in have.items()]
        config["logging"] = logging
        self._b.reconfigure_kubelet(node, yaml.safe_dump(config))
        self._config_saved[node] = text

    def _journal(self, node: str) -> _Journal:
        j = self._journals.get(node)
        if j is None:
            now = float(self._b.nodeops.exec(node, "date +%s.%N").strip())
            j = self._journals[node] = _Journal(now)
        return j

    def _read(self, node: str) -> _Journal:
        j = self._journal(node)
        out = self._b.nodeops.exec(node, read_script(j.cursor, "unit-start"))
        j.pid = read_into(j.state, out, j._keep_cursor)
        return j

    def kubelet_running(self, node: str) -> bool:
        return self._b.nodeops.kubelet_active(node)

    def registered_drivers(self, node: str) -> dict[str, list[str]]:
        j = self._read(node)
        return j.state.registered(j.pid)

    def driver_usable(self, node: str, driver: str) -> bool:
        j = self._read(node)
        return j.state.usable(j.pid, driver)

    def driver_service(self, node: str, driver: str) -> str | None:
        j = self._read(node)
        return j.state.chosen_service(j.pid, driver)

    def registration_events(self, node: str) -> list[RegistrationRecord]:
        return list(self._read(node).state.events)

    def dra_calls(self, node: str) -> list[DRACallRecord]:
        return list(self._read(node).state.calls)

    def read_dra_checkpoint(self, node: str) -> bytes | None:
        return self._b.nodeops.read_file(node, DRA_CHECKPOINT_PATH)

    def cdi_spec_files(self, node: str, *, nested: bool = False) -> dict[str, bytes]:
        with tempfile.TemporaryDirectory(prefix="devplug-cdi-") as tmp:
            self._b.nodeops.read_tree(node, cdi.SPEC_DIRS, Path(tmp), recursive=nested)
            return {f"/{f.relative_to(tmp)}": f.read_bytes() for f in sorted(Path(tmp).rglob("*")) if f.is_file()}

    def pending_prepares(self, node: str) -> dict[str, str]:
        """Pod UID -> the last ``FailedPrepareDynamicResources`` event of each Pending pod of the run on the node."""
        out: dict[str, str] = {}
        ns = self._b.pod_namespace
        pending = {
            p["metadata"]["name"]: p["metadata"]["uid"]
            for p in self._b.api.list_pods(ns, field_selector=f"spec.nodeName={node},status.phase=Pending")
        }
        for e in self._b.events(namespace=ns):
            name = (e.get("involvedObject") or {}).get("name")
            if e.get("reason") == "FailedPrepareDynamicResources" and name in pending:
                out[pending[name]] = str(e.get("message", ""))
        return out

    def _endpoint(self, node: str, driver: str) -> tuple[str, str]:
        j = self._read(node)
        endpoints = j.state.registered(j.pid).get(driver)
        if not endpoints:
            raise BackendError(f"DRA driver {driver} is not registered with the kubelet on {node}")
        return endpoints[-1], j.state.chosen_service(j.pid, driver) or "v1.DRAPlugin"

    def call_driver(self, node: str, driver: str, method: str, claims: Sequence[Mapping[str, str]]) -> Any:
        if method not in ("NodePrepareResources", "NodeUnprepareResources"):
            raise ValueError(f"unknown DRA method {method!r}")
        endpoint, service = self._endpoint(node, driver)
        module, full = _SERVICES.get(service, _SERVICES["v1.DRAPlugin"])
        request = getattr(module, f"{method}Request")(
            claims=[module.Claim(namespace=c["namespace"], uid=c["uid"], name=c["name"]) for c in claims]
        )
        try:
            raw = self._b.nodeops.transport.grpc_call(
                node,
                endpoint,
                f"/{full}/{method}",
                request.SerializeToString(),
                timeout=max(self._b.options.timeout, 10.0),
            )
        except NodeGrpcError as exc:
            raise BackendError(f"{method} on {driver}: {exc}") from None
        # v1beta1 messages are field for field v1's: read the answer as v1, as the kubelet converts it
        return getattr(pb, f"{method}Response").FromString(raw)

    def driver_health(
        self, node: str, driver: str, service: str = "v1alpha1.DRAResourceHealth"
    ) -> list[tuple[str, str, str]] | None:
        endpoint, _ = self._endpoint(node, driver)
        try:
            raw = self._b.nodeops.transport.grpc_call(
                node,
                endpoint,
                _HEALTH_METHODS[service],
                hpb.NodeWatchResourcesRequest().SerializeToString(),
                timeout=max(self._b.options.timeout, 10.0),
                stream=True,
            )
        except NodeGrpcError as exc:
            if exc.code == "UNIMPLEMENTED":
                return None
            raise BackendError(f"NodeWatchResources on {driver}: {exc}") from None
        first = hpb.NodeWatchResourcesResponse.FromString(raw)
        names = {hpb.HEALTHY: "Healthy", hpb.UNHEALTHY: "Unhealthy"}
        return [(d.device.pool_name, d.device.device_name, names.get(d.health, "Unknown")) for d in first.devices]

    def driver_services(self, node: str, driver: str) -> tuple[str, ...] | None:
        listing = self._b.nodeops.exec(node, f"ls -1 {PLUGINS_REGISTRY} 2>/dev/null || true")
        for name in sorted(n for n in listing.split() if n.endswith(".sock")):
            try:
                raw = self._b.nodeops.transport.grpc_call(
                    node,
                    f"{PLUGINS_REGISTRY}/{name}",
                    _GET_INFO,
                    rpb.InfoRequest().SerializeToString(),
                    timeout=max(self._b.options.timeout, 10.0),
                )
            except NodeGrpcError:
                continue
            info = rpb.PluginInfo.FromString(raw)
            if info.name == driver:
                return tuple(info.supported_versions)
        return None

    def refuse_next_registration(self, node: str, reason: str) -> None:
        raise UnsupportedOperationError(
            "a real kubelet refuses a registration only for a reason of the driver's (an unsupported version, a "
            "name it cannot use); nothing makes it refuse one on purpose"
        )

    # -- knobs ---------------------------------------------------------------------------------------
    def set_dra_timings(self, **seconds: float) -> None:
        raise UnsupportedOperationError(
            f"a real kubelet's DRA periods are constants of its code ({KUBELET_DRA_TIMINGS}); "
            "no flag or config field changes them"
        )

    def dra_timings(self) -> dict[str, float]:
        """The constants, with ``retry_period`` the longer of the back-off and the pod resync of the nodes' kubelets."""
        return {
            **KUBELET_DRA_TIMINGS,
            "retry_period": max([KUBELET_DRA_TIMINGS["retry_period"], *self._sync_s.values()]),
        }

    def _check_mock(self, node: str) -> None:
        if not self._driver(node).spec.mock:
            raise BackendError(f"the DRA driver on {node} was deployed without a mock-NVML state file")

    def read_driver_mock_state(self, node: str) -> dict[str, Any]:
        self._check_mock(node)
        return self._b.nodeops.read_json(node, DRA_MOCK_STATE_PATH)

    def write_driver_mock_state(self, node: str, state: dict[str, Any]) -> None:
        self._check_mock(node)
        self._b.nodeops.write_file(node, DRA_MOCK_STATE_PATH, json.dumps(state, indent=1).encode())
