"""What the DRA fixtures need from a backend beyond the device-plugin protocol: the driver's process on a node,
the kubelet's view of it, and the API server (``resource.k8s.io/v1`` objects are read and made through it).

A backend offers it as its ``dra`` attribute (:func:`dra_of`): the embedded kubelet with the real control plane
(``backends/sim_dra.py``) and the real clusters, kind and cluster (``backends/k8s/dra.py``). Backends without it make
the DRA fixtures skip with ``UnsupportedOperationError`` naming what is missing, as any ability a backend lacks;
so does an operation a backend cannot do (a real kubelet refuses no registration on purpose).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ..errors import UnsupportedOperationError
from ..kuberest import KubeRest
from .mockstate import DEFAULT_GPU_MODEL
from .placeholders import fill_placeholders

__all__ = [
    "DEFAULT_DRIVER_NAME",
    "DIR_PLACEHOLDERS",
    "DRABackend",
    "DRACallRecord",
    "DriverSpec",
    "HasDRA",
    "RegistrationRecord",
    "dra_of",
]

#: The driver name of the included GPU plugin's DRA mode (``devplug-gpu-plugin --dra``).
DEFAULT_DRIVER_NAME = "gpu.devplug.io"
#: Placeholders that give a driver the node's directories as flags; a command without any of them runs at the
#: kubelet's standard paths, as its DaemonSet would.
DIR_PLACEHOLDERS = ("{plugins_registry}", "{plugins_dir}", "{cdi_root}")


@dataclass(frozen=True)
class DriverSpec:
    """How to deploy the DRA driver under test on a node.

    ``argv`` (sim) and ``env`` values may hold the placeholders ``{plugins_registry}``, ``{plugins_dir}``,
    ``{cdi_root}``, ``{node_name}``, ``{kubeconfig}``, ``{mock_state}`` and ``{python}``, filled by :meth:`command`
    when the driver is started. ``driver_name`` is the name the driver registers and publishes its slices under.
    ``mock``: the driver reads the mock-NVML state. On a real cluster (kind, cluster) the driver is deployed from
    ``manifest`` (its ServiceAccount, RBAC and DaemonSet; ``None``: the included driver's) with its containers
    running ``image`` (``None``: the included driver's image, or the manifest's own images); ``env`` is set in its
    containers.
    """

    driver_name: str = DEFAULT_DRIVER_NAME
    argv: Sequence[str] = ()
    image: str | None = None
    manifest: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    mock: bool = False
    gpus: int = 4
    numa_nodes: int = 2
    #: The mock GPUs' model (``mockstate.GPU_MODELS``).
    gpu_model: str = DEFAULT_GPU_MODEL
    #: MIG devices (profiles) on every mock GPU, which are then MIG-enabled; none: MIG off.
    mig: tuple[str, ...] = ()
    #: Run in the node's private mount namespace at the kubelet's standard paths (``/var/lib/kubelet/plugins_registry``,
    #: ``/var/lib/kubelet/plugins``, ``/etc/cdi``, ``/var/run/cdi``, the service account's files). ``None``: exactly
    #: when no directory placeholder appears in ``argv`` or ``env``.
    standard_paths: bool | None = None

    def uses_standard_paths(self) -> bool:
        if self.standard_paths is not None:
            return self.standard_paths
        return not any(p in a for a in [*self.argv, *self.env.values()] for p in DIR_PLACEHOLDERS)

    def command(
        self,
        *,
        plugins_registry: str | os.PathLike[str],
        plugins_dir: str | os.PathLike[str],
        cdi_root: str | os.PathLike[str],
        node_name: str,
        kubeconfig: str | os.PathLike[str],
        mock_state: str | os.PathLike[str] | None,
    ) -> tuple[list[str], dict[str, str]]:
        """``argv`` and ``env`` as the driver is started on a node: ``{plugins_registry}`` and ``{plugins_dir}`` are
        the node's kubelet ``plugins_registry`` and ``plugins`` dirs, ``{cdi_root}`` its ``/var/run/cdi``,
        ``{node_name}`` its name, ``{kubeconfig}`` a kubeconfig with the driver's service-account credentials,
        ``{mock_state}`` the mock-NVML state file (empty without one), ``{python}`` this interpreter. The one place
        the placeholders are filled."""
        values = {
            "plugins_registry": plugins_registry,
            "plugins_dir": plugins_dir,
            "cdi_root": cdi_root,
            "node_name": node_name,
            "kubeconfig": kubeconfig,
            "mock_state": mock_state or "",
        }
        return fill_placeholders(self.argv, self.env, {k: os.fspath(v) for k, v in values.items()})


@dataclass(frozen=True)
class RegistrationRecord:
    """One outcome of the kubelet's plugin watcher: ``kind`` registered / failed / deregistered."""

    kind: str
    socket: str
    name: str
    detail: str


@dataclass(frozen=True)
class DRACallRecord:
    """One NodePrepareResources / NodeUnprepareResources the kubelet made: ``error`` is the call's gRPC error, else
    the claims the driver answered with an error (``claim <uid>: <error>``, "; " between); "" when every claim
    succeeded."""

    driver: str
    method: str
    claim_uids: tuple[str, ...]
    error: str
    at: float


@runtime_checkable
class DRABackend(Protocol):
    """A node's DRA side as the fixtures drive it. Objects are JSON-shaped dicts."""

    #: The API server, for ResourceSlices, DeviceClasses, ResourceClaims and templates.
    rest: KubeRest

    # -- the driver under test -------------------------------------------------------------------
    def deploy_driver(self, node: str, spec: DriverSpec) -> None: ...

    def remove_driver(self, node: str) -> None: ...

    def stop_driver(self, node: str) -> None:
        """SIGTERM; returns once the kubelet has seen it go (deregistered or disconnected)."""

    def kill_driver(self, node: str) -> None:
        """SIGKILL (sockets left behind); returns once the kubelet has seen it go."""

    def start_driver(self, node: str) -> None: ...

    def driver_running(self, node: str) -> bool: ...

    def driver_exit(self, node: str) -> str | None:
        """How the driver process ended (``"exited with status 1"``), ``None`` while it runs or may start."""

    def driver_log(self, node: str) -> str: ...

    def driver_restarts(self, node: str) -> int:
        """How many times the node restarted the driver's process on its own since it was started (a DaemonSet
        pod's ``restartCount``)."""

    # -- the kubelet's view ----------------------------------------------------------------------
    def kubelet_running(self, node: str) -> bool: ...

    def registered_drivers(self, node: str) -> dict[str, list[str]]:
        """Driver name -> endpoints of its plugins the kubelet has registered."""

    def driver_usable(self, node: str, driver: str) -> bool:
        """A plugin of ``driver`` is registered and its DRA socket connected."""

    def driver_service(self, node: str, driver: str) -> str | None:
        """The gRPC service the kubelet chose for the driver (``v1.DRAPlugin``), ``None`` when not registered."""

    def registration_events(self, node: str) -> list[RegistrationRecord]: ...

    def dra_calls(self, node: str) -> list[DRACallRecord]:
        """Every prepare/unprepare call the kubelet made on the node, oldest first."""

    def read_dra_checkpoint(self, node: str) -> bytes | None:
        """``dra_manager_state`` as on the node (``None``: none written yet)."""

    def cdi_spec_files(self, node: str, *, nested: bool = False) -> dict[str, bytes]:
        """The plain files in the node's CDI spec directories (``/etc/cdi``, ``/var/run/cdi``), by their path on the
        node; ``nested``: those in their subdirectories too (which a runtime does not read)."""

    def pending_prepares(self, node: str) -> dict[str, str]:
        """Pod UID -> last prepare error, for pods whose containers wait for their claims."""

    def call_driver(self, node: str, driver: str, method: str, claims: Sequence[Mapping[str, str]]) -> Any:
        """Call the driver's DRA service directly, as the kubelet does (``NodePrepareResources`` or
        ``NodeUnprepareResources`` with ``claims`` of ``namespace``/``uid``/``name``): the response message."""

    def driver_health(
        self, node: str, driver: str, service: str = "v1alpha1.DRAResourceHealth"
    ) -> list[tuple[str, str, str]] | None:
        """The first message of the driver's ``NodeWatchResources`` stream of ``service`` (``v1.DRAResourceHealth`` or
        ``v1alpha1.DRAResourceHealth``) as (pool, device, health); ``None`` when the driver does not serve it
        (UNIMPLEMENTED)."""

    def driver_services(self, node: str, driver: str) -> tuple[str, ...] | None:
        """What the driver's registration socket in ``plugins_registry`` lists in GetInfo (``supported_versions``);
        ``None`` when no socket there answers for ``driver``."""

    def refuse_next_registration(self, node: str, reason: str) -> None:
        """Make the kubelet refuse the driver's next registration attempt with ``reason``."""

    # -- knobs -----------------------------------------------------------------------------------
    def set_dra_timings(self, **seconds: float) -> None:
        """``wiping_delay``, ``retry_period``, ``reconcile_period`` (sim; real kubelets raise
        UnsupportedOperationError)."""

    def dra_timings(self) -> dict[str, float]: ...

    def read_driver_mock_state(self, node: str) -> dict[str, Any]: ...

    def write_driver_mock_state(self, node: str, state: dict[str, Any]) -> None: ...


class HasDRA(Protocol):
    """What :func:`dra_of` reads of a backend (every :class:`~.base.Backend` has it; ``base`` imports this module,
    so the whole protocol cannot be named here)."""

    @property
    def name(self) -> str: ...

    @property
    def dra(self) -> DRABackend | None: ...


def dra_of(backend: HasDRA) -> DRABackend:
    """The backend's DRA side, or ``UnsupportedOperationError`` saying why there is none."""
    dra = backend.dra
    if dra is None:
        why = (
            "a DRA driver reads its claims from the API server and publishes ResourceSlices through it, which the "
            "embedded control plane does not serve: run with --devplug-control-plane real "
            "(devplug conformance --dra does)"
            if backend.name == "sim"
            else f"the {backend.name} backend has no DRA side (not started, or not a backend with one: "
            "sim with the real control plane, kind, cluster)"
        )
        raise UnsupportedOperationError(why)
    return dra
