"""The ``sim`` backend's DRA side (:class:`~pytest_devplug.backends.dra.DRABackend`): drivers as processes of a node
of the embedded kubelet, with the real control plane's API server.

A driver command without directory placeholders runs as its DaemonSet would start it: in the node's private
mount namespace, where the node's directories are at the kubelet's standard paths (``plugins_registry``,
``plugins``, ``/etc/cdi``, ``/var/run/cdi``), the service account's token and CA at
``/var/run/secrets/kubernetes.io/serviceaccount``, with ``NODE_NAME``, ``KUBERNETES_SERVICE_HOST`` and
``KUBERNETES_SERVICE_PORT`` set (``sim/dra/incluster.py``).
"""

from __future__ import annotations

import json
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import grpc

from ..api.dra import v1_pb2 as pb
from ..api.drahealth import v1_pb2 as hpb1
from ..api.drahealth import v1_pb2_grpc as hpb1_grpc
from ..api.drahealth import v1alpha1_pb2 as hpb
from ..api.drahealth import v1alpha1_pb2_grpc as hpb_grpc
from ..api.pluginregistration import v1_pb2 as rpb
from ..api.pluginregistration import v1_pb2_grpc as rpb_grpc
from ..kuberest import KubeRest
from ..errors import BackendError, BackendUnavailableError, DRAPluginCallError, RestError, UnsupportedOperationError
from ..kubeletmodel import cdi
from ..sim.dra.client import SERVICE_V1, DRAPluginClient
from ..sim.dra.health import HEALTH_SERVICE_V1, HEALTH_SERVICE_V1ALPHA1
from ..sim.endpoint import go_rpc_error
from ..sim.pluginwatcher import DRA_PLUGIN_TYPE
from ..sim.dra.incluster import SERVICE_ACCOUNT_DIR, DriverCredentials, driver_credentials
from ..waiting import wait_for
from . import mockstate
from .base import BackendOptions, PluginSpec
from .dra import DRACallRecord, DriverSpec, RegistrationRecord
from .mocknvml import mock_nvml_env

if TYPE_CHECKING:
    from ..controlplane import ControlPlane
    from ..sim.realplane import RealPlane
    from ..sim.controlplanes import SimControlPlane
    from ..sim.daemon import PluginDaemon
    from ..sim.kubelet import SimNode

__all__ = ["SimDRA", "SimDRAHost"]


class SimDRAHost(Protocol):
    """What :class:`SimDRA` needs of its :class:`~pytest_devplug.backends.sim.SimBackend`, and no more: as the
    kubelet's DRA manager is handed narrow functions (``getNode``, ``activePods``), not the kubelet."""

    @property
    def options(self) -> BackendOptions: ...

    @property
    def control_plane(self) -> ControlPlane | None:
        """The real control plane (its server and CA go into the drivers' credentials)."""

    @property
    def cluster(self) -> SimControlPlane | None: ...

    def sim_node(self, name: str) -> SimNode:
        """The node's embedded kubelet; ``ObjectNotFoundError`` when there is none."""

    def node_files(self, node: str, spec: PluginSpec) -> list[tuple[Path, str]]:
        """The node's device nodes and files, bound into a process started there as they are for a plugin."""


@dataclass
class _Driver:
    spec: DriverSpec
    proc: PluginDaemon
    mock_path: Path | None


class SimDRA:
    """Drivers on the nodes of one :class:`~pytest_devplug.backends.sim.SimBackend` with a real control plane."""

    def __init__(self, backend: SimDRAHost, client: Any) -> None:
        self._backend = backend
        self.rest = KubeRest(client, max(backend.options.timeout, 10.0))
        self._drivers: dict[str, _Driver] = {}
        self._credentials: dict[str, DriverCredentials] = {}
        self._serial = 0

    def close(self) -> None:
        for node in list(self._drivers):
            self.remove_driver(node)

    def _kubelet(self, node: str) -> Any:
        n = self._backend.sim_node(node)
        if n.dra is None:
            raise BackendUnavailableError(
                f"node {node} has no DRA side (its kubelet has no API server to read claims from)"
            )
        return n

    def _dra(self, node: str) -> Any:
        return self._kubelet(node).dra

    def _driver(self, node: str) -> _Driver:
        try:
            return self._drivers[node]
        except KeyError:
            raise BackendError(f"no DRA driver deployed on node {node}") from None

    # -- the driver process ------------------------------------------------------------------------
    def _credentials_for(self, node: str, where: Path) -> DriverCredentials:
        if node not in self._credentials:
            cp = self._backend.control_plane
            if cp is None or cp.pki is None:
                raise BackendError("DRA drivers need the real control plane (--devplug-control-plane real)")
            try:
                self._credentials[node] = driver_credentials(self.rest, cp.server, cp.pki.ca_cert, where)
            except RestError as exc:
                raise BackendError(f"cannot make the driver's service account on node {node}: {exc}") from None
        return self._credentials[node]

    def deploy_driver(self, node: str, spec: DriverSpec) -> None:
        if node in self._drivers:
            raise BackendError(f"a DRA driver is already deployed on {node}; remove it first")
        if not spec.argv:
            raise BackendError("the sim backend runs the DRA driver from DriverSpec.argv, which is empty")
        n = self._kubelet(node)
        node_dir = Path(n.node_dir)
        creds = self._credentials_for(node, node_dir / "driver-secrets")
        mock_path: Path | None = None
        if spec.mock:
            mock_path = node_dir / "mock-dra" / "mock-state.json"
            mock_path.parent.mkdir(exist_ok=True)
            self.write_mock(mock_path, mockstate.initial_state(spec.gpus, spec.numa_nodes, spec.mig, spec.gpu_model))
        argv, own_env = spec.command(
            plugins_registry=n.dra.registry_dir,
            plugins_dir=n.dra.plugins_dir,
            cdi_root=node_dir / "cdi",
            node_name=node,
            kubeconfig=creds.kubeconfig,
            mock_state=mock_path,
        )
        env = {"NODE_NAME": node, **creds.env, **own_env}
        if mock_path is not None:
            env = {**mock_nvml_env(mock_path), **env}
        standard = spec.uses_standard_paths()
        binds = [(creds.directory, SERVICE_ACCOUNT_DIR)] if standard else []
        # the mock GPU node's files, as for a device plugin on the mock NVML
        binds += self._backend.node_files(
            node,
            PluginSpec(
                mock=spec.mock, gpus=spec.gpus, numa_nodes=spec.numa_nodes, mig=spec.mig, gpu_model=spec.gpu_model
            ),
        )
        self._serial += 1
        proc = n.start_plugin(
            argv, name=f"dra-driver-{self._serial}", env=env, standard_paths=standard, extra_binds=binds
        )
        self._drivers[node] = _Driver(spec, proc, mock_path)

    @staticmethod
    def write_mock(path: Path, state: dict[str, Any]) -> None:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(path)

    def remove_driver(self, node: str) -> None:
        d = self._drivers.pop(node, None)
        if d is not None and d.proc.running:
            d.proc.stop(timeout=5.0)

    def _wait_gone(self, node: str, driver: str) -> None:
        dra = self._dra(node)
        wait_for(
            lambda: dra.usable(driver),
            lambda usable: not usable,
            timeout=self._backend.options.timeout,
            what=f"the kubelet on {node} seeing DRA driver {driver} go",
        )

    def stop_driver(self, node: str) -> None:
        d = self._driver(node)
        if d.proc.running:
            d.proc.stop(timeout=5.0)
            self._wait_gone(node, d.spec.driver_name)

    def kill_driver(self, node: str) -> None:
        d = self._driver(node)
        if d.proc.running:
            d.proc.kill(signal.SIGKILL)
            d.proc.wait(timeout=5.0)
            self._wait_gone(node, d.spec.driver_name)

    def start_driver(self, node: str) -> None:
        d = self._driver(node)
        if not d.proc.running:
            d.proc.start()

    def driver_running(self, node: str) -> bool:
        d = self._drivers.get(node)
        return bool(d is not None and d.proc.running)

    def driver_exit(self, node: str) -> str | None:
        """Why the driver cannot come up by itself any more (stopped, or crash-looping under the kubelet's
        back-off, as its DaemonSet's pod would), or ``None`` while it runs or is about to be restarted."""
        d = self._drivers.get(node)
        return None if d is None else d.proc.exit_reason()

    def driver_restarts(self, node: str) -> int:
        return self._driver(node).proc.restarts

    def driver_log(self, node: str) -> str:
        return str(self._driver(node).proc.log())

    # -- the kubelet's view ----------------------------------------------------------------------
    def kubelet_running(self, node: str) -> bool:
        return bool(self._kubelet(node).running)

    def registered_drivers(self, node: str) -> dict[str, list[str]]:
        return dict(self._dra(node).registered())

    def driver_usable(self, node: str, driver: str) -> bool:
        return bool(self._dra(node).usable(driver))

    def driver_service(self, node: str, driver: str) -> str | None:
        service = self._dra(node).chosen_service(driver)
        return None if service is None else str(service)

    def registration_events(self, node: str) -> list[RegistrationRecord]:
        events = self._kubelet(node).registration_events()  # a socket that never answered GetInfo may be a driver's
        return [
            RegistrationRecord(e.kind, e.socket, e.name, e.detail)
            for e in events
            if e.plugin_type in (DRA_PLUGIN_TYPE, "")
        ]

    def dra_calls(self, node: str) -> list[DRACallRecord]:
        return [DRACallRecord(c.driver, c.method, c.claim_uids, c.error, c.at) for c in list(self._dra(node).calls)]

    def read_dra_checkpoint(self, node: str) -> bytes | None:
        try:
            return Path(self._dra(node).checkpoint_path).read_bytes()
        except FileNotFoundError:
            return None

    def pending_prepares(self, node: str) -> dict[str, str]:
        return dict(self._dra(node).pending())

    def cdi_spec_files(self, node: str, *, nested: bool = False) -> dict[str, bytes]:
        dirs = self._kubelet(node).cdi_spec_dirs  # the node's /etc/cdi, /var/run/cdi
        return {
            f"{where}/{f.relative_to(d)}": f.read_bytes()
            for where, d in zip(cdi.SPEC_DIRS, dirs, strict=True)
            if d.is_dir()
            for f in sorted(d.rglob("*") if nested else d.iterdir())
            if f.is_file()
        }

    def call_driver(self, node: str, driver: str, method: str, claims: Sequence[Mapping[str, str]]) -> Any:
        dra = self._dra(node)
        endpoints = dra.registered().get(driver)
        if not endpoints:
            raise BackendError(f"DRA driver {driver} is not registered with the kubelet on {node}")
        client = DRAPluginClient(
            driver,
            Path(endpoints[-1]),
            dra.chosen_service(driver) or SERVICE_V1,
            call_timeout=max(self._backend.options.timeout, 10.0),
        )
        request = [pb.Claim(namespace=c["namespace"], uid=c["uid"], name=c["name"]) for c in claims]
        try:
            if method == "NodePrepareResources":
                return client.node_prepare_resources(request)
            if method == "NodeUnprepareResources":
                return client.node_unprepare_resources(request)
            raise ValueError(f"unknown DRA method {method!r}")
        except DRAPluginCallError as exc:
            raise BackendError(f"{method} on {driver}: {exc}") from None
        finally:
            client.close()

    def driver_health(
        self, node: str, driver: str, service: str = HEALTH_SERVICE_V1ALPHA1
    ) -> list[tuple[str, str, str]] | None:
        endpoints = self._dra(node).registered().get(driver)
        if not endpoints:
            raise BackendError(f"DRA driver {driver} is not registered with the kubelet on {node}")
        channel = grpc.insecure_channel(f"unix://{endpoints[-1]}", options=[("grpc.default_authority", "localhost")])
        stubs, messages = (hpb1_grpc, hpb1) if service == HEALTH_SERVICE_V1 else (hpb_grpc, hpb)
        try:
            stream = stubs.DRAResourceHealthStub(channel).NodeWatchResources(
                messages.NodeWatchResourcesRequest(), timeout=max(self._backend.options.timeout, 10.0)
            )
            first = next(iter(stream))
            stream.cancel()
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                return None
            raise BackendError(f"NodeWatchResources on {driver}: {go_rpc_error(err)}") from None
        except StopIteration:
            raise BackendError(f"NodeWatchResources on {driver} ended without a message") from None
        finally:
            channel.close()
        names = {hpb.HEALTHY: "Healthy", hpb.UNHEALTHY: "Unhealthy"}
        return [(d.device.pool_name, d.device.device_name, names.get(d.health, "Unknown")) for d in first.devices]

    def driver_services(self, node: str, driver: str) -> tuple[str, ...] | None:
        timeout = max(self._backend.options.timeout, 10.0)
        for socket in sorted(self._dra(node).registry_dir.glob("*.sock")):
            channel = grpc.insecure_channel(f"unix://{socket}", options=[("grpc.default_authority", "localhost")])
            try:
                info = rpb_grpc.RegistrationStub(channel).GetInfo(rpb.InfoRequest(), timeout=timeout)  # type: ignore[no-untyped-call]
            except grpc.RpcError:
                continue
            finally:
                channel.close()
            if info.name == driver:
                return tuple(info.supported_versions)
        return None

    def refuse_next_registration(self, node: str, reason: str) -> None:
        self._dra(node).refuse_next_registration(reason)

    # -- knobs -----------------------------------------------------------------------------------
    def set_dra_timings(self, **seconds: float) -> None:
        unknown = set(seconds) - {"wiping_delay", "retry_period", "reconcile_period"}
        if unknown:
            raise UnsupportedOperationError(f"no DRA timing named {', '.join(sorted(unknown))}")
        self._api_cluster().set_dra_timings(**seconds)

    def dra_timings(self) -> dict[str, float]:
        return dict(vars(self._api_cluster().dra_timings))

    def _api_cluster(self) -> RealPlane:
        from ..sim.realplane import RealPlane  # the kubernetes client: only with the real control plane

        cluster = self._backend.cluster
        if cluster is None:
            raise BackendError("sim backend not started")
        if not isinstance(cluster, RealPlane):
            raise UnsupportedOperationError("DRA timings need the real control plane (--devplug-control-plane real)")
        return cluster

    def _mock_path(self, node: str) -> Path:
        path = self._driver(node).mock_path
        if path is None:
            raise BackendError(f"the DRA driver on {node} was deployed without a mock-NVML state file")
        return path

    def read_driver_mock_state(self, node: str) -> dict[str, Any]:
        return dict(json.loads(self._mock_path(node).read_text()))

    def write_driver_mock_state(self, node: str, state: dict[str, Any]) -> None:
        self.write_mock(self._mock_path(node), state)
