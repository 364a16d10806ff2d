"""``ControlPlane``: a real Kubernetes control plane for one test run, in seconds, without Docker.

etcd, kube-apiserver, kube-scheduler and kube-controller-manager (only the controllers a node's life
needs: service accounts and their tokens, node lifecycle, and DRA's resource claims) run as children of the test run
on loopback ports, with their own certificates and data under one directory that :meth:`ControlPlane.stop` removes.
The ``resource.k8s.io/v1`` API (DRA) is on, and so is the scheduler's DRA plugin (both default since 1.34); every
other feature gate is at the release's default unless ``feature_gates`` sets it (all three components get it).

Usable on its own::

    with ControlPlane(resolve()) as cp:
        client = cp.client()          # a kubernetes.client.ApiClient for the admin user
        print(cp.kubeconfig)          # for kubectl --kubeconfig
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from ..procs import workdir
from ..procs.process import start_time
from ..waiting import wait_for
from ..errors import ComponentFailedError, ControlPlaneError, WaitTimeout
from .binaries import Binaries
from .pki import Pki, make_pki
from .processes import PORT_RETRIES, Component, free_port, log_tail, terminate, write_kubeconfig

__all__ = ["ControlPlane", "CONTROLLERS", "stop_kept"]

#: The controllers kube-controller-manager runs: the default ServiceAccount (pods need it to be admitted)
#: and its token, node lifecycle (it lifts the not-ready taint new Nodes are created with), DRA's
#: ResourceClaims (claims made from a pod's ResourceClaimTemplate, ``reservedFor`` released when a pod is gone) and
#: device taints (evicts pods from NoExecute-tainted devices, reports on DeviceTaintRules; off with DRADeviceTaints).
CONTROLLERS = (
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "node-lifecycle-controller",
    "resourceclaim-controller",
    "device-taint-eviction-controller",
)
SERVICE_CIDR = "10.0.0.0/24"
PIDS_FILE = "pids.json"


class ControlPlane:
    """One control plane; ``start()`` it (or use it as a context manager), ``stop()`` removes every trace.

    ``workdir``: where its data goes (default: a new short work dir of its own, removed on stop).
    ``timeout``: seconds each component may take to answer its health check.
    """

    def __init__(
        self,
        binaries: Binaries,
        workdir_path: Path | None = None,
        *,
        timeout: float = 30.0,
        keep: bool = False,
        feature_gates: str = "",
    ) -> None:
        self.binaries = binaries
        #: ``--feature-gates`` of every component (``A=true,B=false``; empty: the release's defaults).
        self.feature_gates = feature_gates
        self.timeout = timeout
        #: Outlive the test run (``--keep-cluster``): no parent-death signal; ``stop_command()`` says how to end it.
        self.keep = keep
        self._own_dir = workdir_path is None
        self._dir_arg = workdir_path
        self.dir: Path | None = None
        self.pki: Pki | None = None
        self.components: list[Component] = []
        self.server = ""
        #: Seconds from ``start()`` to a control plane that admits pods (for the bench and the header).
        self.startup_seconds = 0.0

    # -- public surface ----------------------------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (``kubectl --kubeconfig``); valid while the control plane runs."""
        if self.dir is None:
            raise ControlPlaneError("the control plane is not started")
        return self.dir / "admin.kubeconfig"

    def client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` for the admin user (needs the ``kubernetes`` package)."""
        import kubernetes

        return kubernetes.config.new_client_from_config(config_file=str(self.kubeconfig))  # type: ignore[no-untyped-call]

    def pids(self) -> dict[str, int]:
        return {c.name: c.pid for c in self.components if c.pid is not None}

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        """etcd, then the API server, then the scheduler and controller manager together; returns once the
        default ServiceAccount exists (the API server admits pods). On failure everything started is stopped."""
        t0 = time.monotonic()
        if not self._own_dir:
            self.dir = Path(self._dir_arg or "")
        elif self.keep:  # no owner record: the next run's sweep leaves it alone
            self.dir = Path(tempfile.mkdtemp(prefix="devplug-kept-cp-", dir=workdir.base_dir()))
        else:
            self.dir = workdir.create("devplug-cp-")
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            self.pki = make_pki(self.dir / "pki")
            etcd_url = self._start_etcd()
            self._start_apiserver(etcd_url)
            write_kubeconfig(self.kubeconfig, self.server, self.pki)
            self._start_together([self._scheduler, self._controller_manager])
            self._wait_default_service_account()
            if self.keep:
                self._record_pids()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - t0

    def _record_pids(self) -> None:
        """``pids.json``: each component's PID and start time, for :func:`stop_kept` (never a reused PID)."""
        record = {c.name: {"pid": c.pid, "start": start_time(c.pid) if c.pid else None} for c in self.components}
        (self._path(PIDS_FILE)).write_text(json.dumps(record, indent=1) + "\n")

    def stop_command(self) -> str:
        """How to stop a kept control plane from a shell."""
        return f"devplug control-plane stop {self.dir}"

    def stop(self) -> None:
        """SIGTERM, then SIGKILL, each component by PID (newest first); remove the data dir if it is ours."""
        for comp in reversed(self.components):
            comp.stop()
        self.components = []
        if self.dir is not None and self._own_dir:
            workdir.remove(self.dir)
        self.dir = None

    # -- components --------------------------------------------------------------------------------
    def _path(self, *parts: str) -> Path:
        assert self.dir is not None
        p = self.dir.joinpath(*parts)
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def _component(self, name: str, argv: list[str], log: Path, url: str, ca: Path | None, **kw: Any) -> Component:
        return Component(name, argv, log, url, ca, detached=self.keep, **kw)

    def _launch_retrying(self, make: Any) -> Component:
        last: ComponentFailedError | None = None
        for _ in range(PORT_RETRIES):
            comp: Component = make()
            comp.launch()
            self.components.append(comp)
            try:
                comp.wait_ready(self.timeout)
                return comp
            except ComponentFailedError as exc:
                self.components.remove(comp)
                last = exc
                if not comp.port_conflict():
                    raise
        assert last is not None
        raise last

    def _start_etcd(self) -> str:
        url: list[str] = []

        def make() -> Component:
            client, peer = free_port(), free_port()
            url[:] = [f"http://127.0.0.1:{client}"]
            data = self._path("etcd", "data")
            argv = [
                str(self.binaries["etcd"]),
                "--name",
                "devplug",
                "--data-dir",
                str(data),
                "--listen-client-urls",
                url[0],
                "--advertise-client-urls",
                url[0],
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-cluster",
                f"devplug=http://127.0.0.1:{peer}",
                "--listen-metrics-urls",
                "",
                "--unsafe-no-fsync",
                "--log-level",
                "warn",
            ]
            return self._component("etcd", argv, self._path("etcd", "etcd.log"), f"{url[0]}/health", None)

        self._launch_retrying(make)
        return url[0]

    def _start_apiserver(self, etcd_url: str) -> None:
        assert self.pki is not None
        pki = self.pki

        def make() -> Component:
            port = free_port()
            self.server = f"https://127.0.0.1:{port}"
            argv = [
                str(self.binaries["kube-apiserver"]),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self._path('apiserver', 'certs')}",
                f"--tls-cert-file={pki.server_cert}",
                f"--tls-private-key-file={pki.server_key}",
                f"--client-ca-file={pki.ca_cert}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=RBAC",
                "--allow-privileged=true",
                "--runtime-config=resource.k8s.io/v1=true",
                "--enable-priority-and-fairness=false",
                "--profiling=false",
                "--v=0",
                *self._gates(),
                # the kubernetes Service's endpoint is of no use here, and 1.37 refuses a loopback one to reconcile
                "--endpoint-reconciler-type=none",
            ]
            return self._component(
                "kube-apiserver",
                argv,
                self._path("apiserver", "kube-apiserver.log"),
                f"{self.server}/readyz",
                pki.ca_cert,
                client_cert=(pki.admin_cert, pki.admin_key),
            )

        self._launch_retrying(make)

    def _gates(self) -> list[str]:
        return [f"--feature-gates={self.feature_gates}"] if self.feature_gates else []

    def _scheduler(self) -> Component:
        port = free_port()
        kc = str(self.kubeconfig)
        argv = [
            str(self.binaries["kube-scheduler"]),
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={self._path('scheduler', 'certs')}",
            "--v=0",
            *self._gates(),
        ]
        return self._component(
            "kube-scheduler",
            argv,
            self._path("scheduler", "kube-scheduler.log"),
            f"https://127.0.0.1:{port}/healthz",
            None,
        )

    def _controller_manager(self) -> Component:
        assert self.pki is not None
        port = free_port()
        kc = str(self.kubeconfig)
        argv = [
            str(self.binaries["kube-controller-manager"]),
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={self._path('controller-manager', 'certs')}",
            f"--controllers={','.join(CONTROLLERS)}",
            f"--service-account-private-key-file={self.pki.sa_key}",
            f"--root-ca-file={self.pki.ca_cert}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--v=0",
            *self._gates(),
        ]
        return self._component(
            "kube-controller-manager",
            argv,
            self._path("controller-manager", "kube-controller-manager.log"),
            f"https://127.0.0.1:{port}/healthz",
            None,
        )

    def _start_together(self, makers: list[Any]) -> None:
        """Launch components that only need the API server at once, then wait for each (retrying port races)."""
        started = [(make, make()) for make in makers]
        for _, comp in started:
            comp.launch()
            self.components.append(comp)
        for make, comp in started:
            try:
                comp.wait_ready(self.timeout)
            except ComponentFailedError:
                self.components.remove(comp)
                if not comp.port_conflict():
                    raise
                self._launch_retrying(make)

    def _wait_default_service_account(self) -> None:
        import kubernetes

        client = self.client()
        core = kubernetes.client.CoreV1Api(client)

        def exists() -> bool:
            try:
                core.read_namespaced_service_account("default", "default", _request_timeout=5)
            except kubernetes.client.ApiException as exc:
                if exc.status == 404:
                    return False
                raise
            return True

        try:
            wait_for(
                exists,
                bool,
                timeout=self.timeout,
                what="the default ServiceAccount (kube-controller-manager's serviceaccount controller)",
            )
        except WaitTimeout as exc:
            cm = next((c for c in self.components if c.name == "kube-controller-manager"), None)
            tail = log_tail(cm.log_path) if cm is not None else "(not started)"
            raise ComponentFailedError(f"{exc}\n--- last lines of kube-controller-manager's log:\n{tail}") from None
        finally:
            client.close()


def stop_kept(directory: Path) -> list[str]:
    """Stop a control plane kept by ``--keep-cluster`` (SIGTERM, then SIGKILL, each recorded PID whose start time
    still matches) and remove its directory; what was done, one line per component."""
    record_path = directory / PIDS_FILE
    try:
        record = json.loads(record_path.read_text())
    except FileNotFoundError:
        raise ControlPlaneError(f"{directory}: no {PIDS_FILE}; not a control plane kept by --keep-cluster") from None
    except ValueError as exc:
        raise ControlPlaneError(f"{record_path}: not valid JSON ({exc})") from None
    done = []
    for name, entry in record.items():
        pid = entry.get("pid")
        if not isinstance(pid, int) or start_time(pid) is None or start_time(pid) != entry.get("start"):
            done.append(f"{name}: not running")
            continue
        terminate(pid, 10.0)
        done.append(f"{name}: pid {pid} stopped")
    shutil.rmtree(directory, ignore_errors=True)
    return done
