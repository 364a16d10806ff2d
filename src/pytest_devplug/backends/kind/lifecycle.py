"""kind cluster lifecycle on pytest-kind-ng: pick kind and the node image, create or reuse, readiness, teardown.

Why pytest-kind-ng: it is the maintained fork of pytest-kind (same ``KindCluster`` and the same
``--cluster-name/--keep-cluster/--kind-bin/--kind-image/--kubeconfig`` options, which pytest-devplug
reuses). Its ``ensure_kind``/``ensure_kubectl`` download binaries from GitHub/dl.k8s.io; we always
hand it a ``kind_path`` (so it never downloads) and talk to the API with the ``kubernetes`` client
(so its kubectl is never needed).

Choices, in order (each documented in docs/guides/backends.md):

- kind binary: ``--kind-bin``, ``$KIND_BIN`` (or build-all.sh's ``$DEVPLUG_KIND_BIN``), ``kind`` on PATH, else
  ``kind-config/offline/ensure-kind.sh`` (repo checkouts: builds the pinned kind with ``go install``).
- node image: ``--kind-image`` or ``$DEVPLUG_KIND_NODE_IMAGE``; ``DEVPLUG_KIND_OFFLINE=1`` builds and uses
  the offline image; ``DEVPLUG_KIND_OFFLINE=0`` forces kind's default; otherwise the offline image is used
  only when it is already present locally (machines with no registry built it), else kind's default.
- config: ``$DEVPLUG_KIND_CONFIG`` (a path, or a file name in ``kind-config/``), default
  ``single-node.yaml``; a copy is written with the offline settings (offline image only) and, when
  ``$DEVPLUG_KIND_KUBELET_VERBOSITY`` is set, that kubelet log level (4 shows PreStartContainer calls, but
  floods the journal: the default keeps kind's own level).
- name: ``--cluster-name``; pytest-kind-ng's own default ``pytest-kind`` means "not chosen": ``devplug``.
- an existing cluster of that name is reused when healthy; one whose node containers are stopped or whose
  API does not answer is deleted and created again. Only a cluster this run created is deleted at the
  end, and never with ``--keep-cluster``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from ...kubeletmodel.releases import DEFAULT_VERSION, release
from ...kuberest import KubeRest
from ...errors import BackendError, BackendUnavailableError, RestError, ToolError, WaitTimeout
from ...waiting import wait_for
from ..base import BackendOptions
from ..k8s.manifests import REPO_ROOT
from .proc import run

__all__ = [
    "ClusterManager",
    "REPO_ROOT",
    "OFFLINE_DIR",
    "KIND_CONFIG_DIR",
    "image_prefix",
    "offline_image_present",
    "python_base_image",
]

KIND_CONFIG_DIR = REPO_ROOT / "kind-config" if REPO_ROOT else None
OFFLINE_DIR = KIND_CONFIG_DIR / "offline" if KIND_CONFIG_DIR else None

#: Label the offline build scripts put on the images they make.
OFFLINE_LABEL = "io.devplug.offline.inputs"
PYTEST_KIND_DEFAULT_NAME = "pytest-kind"
DEFAULT_NAME = "devplug"

#: Used when no kind-config/ is at hand (an installed package): kind-config/single-node.yaml's content.
_FALLBACK_CONFIG = {
    "kind": "Cluster",
    "apiVersion": "kind.x-k8s.io/v1alpha4",
    "kubeadmConfigPatches": [
        "kind: KubeletConfiguration\nnodeStatusUpdateFrequency: 1s\nsyncFrequency: 10s\nlogging:\n  vmodule:\n"
        "    - {filePattern: dra_plugin, verbosity: 4}\n    - {filePattern: dra_plugin_manager, verbosity: 4}\n"
    ],
    "nodes": [{"role": "control-plane", "labels": {"devplug.io/gpu": "true"}}],
}
KUBELET_VERBOSITY_PATCH = "kind: KubeletConfiguration\nlogging:\n  verbosity: 4\n"

#: Bounded waits of cluster start (seconds); each failure says which condition did not hold.
CREATE_TIMEOUT = 900.0
READY_TIMEOUT = 240.0
HEALTH_PROBE_TIMEOUT = 30.0


def _versions() -> dict[str, str]:
    out: dict[str, str] = {}
    if OFFLINE_DIR is None:
        return out
    for line in (OFFLINE_DIR / "versions.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            out[k] = v
    return out


def image_labels(image: str) -> dict[str, str] | None:
    proc = run(["docker", "image", "inspect", "-f", "{{json .Config.Labels}}", image], check=False, timeout=60)
    if proc.returncode != 0:
        return None
    return dict(json.loads(proc.stdout or "null") or {})


def image_prefix() -> str:
    """Repository part of the images the offline scripts build (their ``DEVPLUG_IMAGE_PREFIX``, lib.sh)."""
    return os.environ.get("DEVPLUG_IMAGE_PREFIX") or "devplug"


def offline_node_image_name(minor: str | None = None) -> str | None:
    """The name build-node-image.sh gives its image of Kubernetes ``minor`` (default: the default release): the same
    inputs, releases.tsv's pin, versions.env's layout revision and the prefix."""
    v = _versions()
    return f"{image_prefix()}/kind-node:{release(minor).kubernetes}-offline-r{v['NODE_LAYOUT_REV']}" if v else None


def offline_image_present(minor: str | None = None) -> bool:
    """Whether this machine has the offline node image of ``minor`` (i.e. it is one with no container registry)."""
    name = offline_node_image_name(minor)
    return name is not None and image_labels(name) is not None


def python_base_image() -> str | None:
    """The local Python base for the plugin image where nothing can be pulled; ``None``: use the standard one."""
    if env := os.environ.get("DEVPLUG_PYTHON_BASE"):
        return env
    v = _versions()
    if not v:
        return None
    name = f"{image_prefix()}/python-base:{v['DEBIAN_SUITE']}-r{v['PYTHON_BASE_REV']}"
    return name if image_labels(name) is not None else None


def _script(name: str, minor: str | None = None) -> str:
    """Run an offline build script (for Kubernetes ``minor``: its ``DEVPLUG_KUBERNETES_VERSION``); its last stdout
    line is its result (a path or an image)."""
    if OFFLINE_DIR is None:
        raise BackendUnavailableError(f"{name} needs a checkout of pytest-devplug (kind-config/offline/)")
    env = {**os.environ, "DEVPLUG_KUBERNETES_VERSION": minor} if minor else None
    proc = run(["bash", str(OFFLINE_DIR / name)], timeout=3600, env=env)
    return proc.stdout.strip().splitlines()[-1]


def _not_ready(api: Any) -> str:
    """Why the cluster behind ``api`` is not ready yet; ``""`` once it is."""
    import kubernetes
    import urllib3

    core: Any = kubernetes.client.CoreV1Api(api)
    try:
        status = KubeRest(api, 10).send("GET", "/readyz")[0]
        if status != 200:
            return f"API /readyz answered {status}"
        nodes = core.list_node(_request_timeout=10).items
        not_ready = [
            n.metadata.name
            for n in nodes
            if not any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or []))
        ]
        if not nodes or not_ready:
            return f"nodes not Ready: {not_ready or 'no nodes registered'}"
        core.read_namespaced_service_account("default", "default", _request_timeout=10)
    except kubernetes.client.ApiException as exc:
        return f"API error {exc.status} {exc.reason}" + (
            " (default ServiceAccount not there yet)" if exc.status == 404 else ""
        )
    except (RestError, urllib3.exceptions.HTTPError, OSError) as exc:
        return f"API not reachable: {exc}"
    return ""


def _env_flag(name: str) -> bool | None:
    raw = os.environ.get(name, "").strip().lower()
    if raw in ("1", "true", "yes"):
        return True
    if raw in ("0", "false", "no"):
        return False
    return None


class ClusterManager:
    """One kind cluster for the session: ``start()`` gets it ready, ``close()`` removes it if we made it."""

    def __init__(self, options: BackendOptions, *, config: str | None = None) -> None:
        self.options = options
        # An explicit config (e.g. the multi-node tests') wins, then --devplug-kind-config / ini
        # devplug_kind_config, then $DEVPLUG_KIND_CONFIG.
        self.config_choice = (
            config or options.kind_config or os.environ.get("DEVPLUG_KIND_CONFIG") or "single-node.yaml"
        )
        name = options.cluster_name
        self.name = os.environ.get("DEVPLUG_KIND_CLUSTER") or (
            DEFAULT_NAME if name == PYTEST_KIND_DEFAULT_NAME else name
        )
        self._workdir: Path | None = None  # made on first use, removed by close()
        self.kind_bin = ""
        self.image: str | None = None
        self.offline = False
        self.created = False
        self.config_path: Path | None = None
        self.kubeconfig: dict[str, Any] = {}
        self.timings: dict[str, float] = {}
        self._pytest_kind: Any = None
        self._pytest_kind_dir: Path | None = None

    @property
    def workdir(self) -> Path:
        if self._workdir is None:
            self._workdir = Path(tempfile.mkdtemp(prefix="devplug-kind-"))
        return self._workdir

    # -- choices ---------------------------------------------------------------------------------
    def _resolve_kind(self) -> str:
        if self.options.kind_bin:
            return self.options.kind_bin
        for var in ("KIND_BIN", "DEVPLUG_KIND_BIN"):  # the latter: what build-all.sh prints
            if (env := os.environ.get(var)) and os.access(env, os.X_OK):
                return env
        if found := shutil.which("kind"):
            return found
        if OFFLINE_DIR is not None:
            return _script("ensure-kind.sh")
        raise BackendUnavailableError(
            "no `kind` on PATH: install it (https://kind.sigs.k8s.io/docs/user/quick-start/#installation) "
            "or pass --kind-bin"
        )

    def _resolve_image(self) -> tuple[str | None, bool]:
        """The node image: ``--kind-image``, else ``$DEVPLUG_KIND_NODE_IMAGE``, else the offline image of the run's
        release (built, or found built), else kind's standard image of that release (``kindest/node:<pin>``; kind's
        own default for the default release)."""
        minor = self.options.kube.release.minor
        image = self.options.kind_image or os.environ.get("DEVPLUG_KIND_NODE_IMAGE")
        if not image:
            offline = _env_flag("DEVPLUG_KIND_OFFLINE")
            if offline:
                image = _script("build-node-image.sh", minor)
            elif offline is None and offline_image_present(minor):
                image = offline_node_image_name(minor)
            elif minor != DEFAULT_VERSION:
                image = f"kindest/node:{self.options.kube.release.kubernetes}"
        if not image:
            return None, False
        return image, OFFLINE_LABEL in (image_labels(image) or {})

    def _config_source(self) -> tuple[str, dict[str, Any]]:
        choice = self.config_choice
        path = Path(choice)
        if not path.is_file() and KIND_CONFIG_DIR is not None:
            path = KIND_CONFIG_DIR / choice
        if path.is_file():
            return str(path), dict(yaml.safe_load(path.read_text()))
        if choice != "single-node.yaml":
            raise BackendUnavailableError(
                f"kind config {choice!r} (--devplug-kind-config / DEVPLUG_KIND_CONFIG): no such file "
                "(nor in kind-config/)"
            )
        return "<built-in single-node>", json.loads(json.dumps(_FALLBACK_CONFIG))

    def _write_config(self) -> Path:
        """The config kind is given: the chosen one plus offline settings (offline image) and kubelet -v=4."""
        src, config = self._config_source()
        if self.offline:
            assert OFFLINE_DIR is not None
            sys.path.insert(0, str(OFFLINE_DIR))
            try:
                import importlib

                patch_config = importlib.import_module("patch-config")
            finally:
                sys.path.remove(str(OFFLINE_DIR))
            config = patch_config.patch(config, patch_config.host_is_cgroup_v1())
        # The run's --devplug-feature-gates, on every component of every node (kind's featureGates); the rest stay
        # at the release's defaults, as on the clusters users run.
        if self.options.kube.feature_gates:
            config.setdefault("featureGates", {}).update(self.options.kube.feature_gates)
        if verbosity := os.environ.get("DEVPLUG_KIND_KUBELET_VERBOSITY"):
            patches = list(config.get("kubeadmConfigPatches") or [])
            patches.append(KUBELET_VERBOSITY_PATCH.replace("4", str(int(verbosity))))
            config["kubeadmConfigPatches"] = patches
        out = self.workdir / "kind-config.yaml"
        out.write_text(f"# written by pytest-devplug from {src}\n" + yaml.safe_dump(config, sort_keys=False))
        return out

    # -- state of a cluster with our name ----------------------------------------------------------
    def _exists(self) -> bool:
        return self.name in run([self.kind_bin, "get", "clusters"], timeout=60).stdout.split()

    def node_containers(self) -> dict[str, str]:
        """Node container name -> docker state (``running``, ``exited``, ...)."""
        proc = run(
            [
                "docker",
                "ps",
                "-a",
                "--filter",
                f"label=io.x-k8s.kind.cluster={self.name}",
                "--format",
                "{{.Names}}\t{{.State}}",
            ],
            timeout=60,
        )
        return dict(line.split("\t", 1) for line in proc.stdout.splitlines() if "\t" in line)

    def _broken(self) -> str | None:
        """Why an existing cluster cannot be used (``None``: it looks healthy)."""
        states = self.node_containers()
        if not states:
            return "kind lists it but no node containers exist"
        stopped = {n: s for n, s in states.items() if s != "running"}
        if stopped:
            return f"node containers not running: {stopped}"
        try:
            self._load_kubeconfig()
            self._wait_ready(HEALTH_PROBE_TIMEOUT)
        except BackendError as exc:
            return f"not ready within {HEALTH_PROBE_TIMEOUT:g}s: {exc}"
        return None

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        if shutil.which("docker") is None or run(["docker", "info"], check=False, timeout=60).returncode != 0:
            raise BackendUnavailableError("the kind backend needs a working Docker engine (`docker info` fails)")
        self.kind_bin = self._resolve_kind()
        self.image, self.offline = self._resolve_image()
        if self._exists():
            why = self._broken()
            if why is None:
                return  # reused as it is (and left alone at the end)
            print(
                f"\ndevplug: kind cluster {self.name} is broken ({why}); deleting and creating it again",
                file=sys.stderr,
            )
            run([self.kind_bin, "delete", "cluster", "--name", self.name], timeout=300)
        self._create()

    def _create(self) -> None:
        from pytest_kind import KindCluster  # pytest-kind-ng

        self.config_path = self._write_config()
        kubeconfig = Path(self.options.kubeconfig) if self.options.kubeconfig else self.workdir / "kubeconfig"
        # KindCluster makes .pytest-kind/<name> in the cwd; note whether we made it, to remove it again.
        pk_dir = Path(".pytest-kind") / self.name
        self._pytest_kind_dir = None if pk_dir.exists() else pk_dir
        self._pytest_kind = KindCluster(
            self.name, kubeconfig=kubeconfig, image=self.image, kind_path=Path(self.kind_bin)
        )
        t0 = time.monotonic()
        self.created = True  # from here on, a failure or Ctrl-C must delete what kind made
        try:
            self._pytest_kind.create(config_file=self.config_path)
        except Exception as exc:
            raise BackendUnavailableError(
                f"kind could not create cluster {self.name} (image {self.image or 'kind default'}, "
                f"config {self.config_path}): {exc}\n{self._diagnose()}"
            ) from None
        self.timings["create_s"] = time.monotonic() - t0
        self._load_kubeconfig()
        self._wait_ready(READY_TIMEOUT)
        self.timings["ready_s"] = time.monotonic() - t0

    def _load_kubeconfig(self) -> None:
        text = run([self.kind_bin, "get", "kubeconfig", "--name", self.name], timeout=60).stdout
        self.kubeconfig = dict(yaml.safe_load(text))

    def api_client(self) -> Any:
        import kubernetes

        return kubernetes.config.new_client_from_config_dict(self.kubeconfig)  # type: ignore[no-untyped-call]

    def _wait_ready(self, timeout: float) -> None:
        """API /readyz answers ok, every node is Ready, and the ``default`` ServiceAccount exists."""
        api = self.api_client()
        try:
            wait_for(
                lambda: _not_ready(api),
                lambda why: not why,
                timeout=timeout,
                interval=1.0,
                what=f"kind cluster {self.name} ready (API /readyz, nodes Ready, default ServiceAccount)",
            )
        except WaitTimeout as exc:
            raise BackendError(str(exc)) from None
        finally:
            api.close()

    def _diagnose(self) -> str:
        out = []
        for node in self.node_containers():
            for unit in ("kubelet", "containerd"):
                p = run(
                    ["docker", "exec", node, "journalctl", "--no-pager", "-n", "30", "-u", unit],
                    check=False,
                    timeout=60,
                )
                out.append(f"--- {unit} journal ({node})\n{p.stdout[-2500:]}")
        return "\n".join(out)

    def load_image(self, image: str, nodes: Sequence[str] = ()) -> None:
        """``kind load docker-image`` into ``nodes`` (default: every node)."""
        only = ["--nodes", ",".join(nodes)] if nodes else []
        try:
            run([self.kind_bin, "load", "docker-image", "--name", self.name, *only, image], timeout=600)
        except ToolError as exc:
            raise BackendError(f"kind load docker-image {image} into {self.name} failed: {exc}") from None

    def close(self) -> None:
        """Delete the cluster if this run created it and ``--keep-cluster`` was not given; remove temp files."""
        try:
            if self.created and not self.options.keep_cluster:
                if self._pytest_kind is not None:
                    try:
                        self._pytest_kind.delete()
                    except Exception:  # noqa: BLE001 - fall back to kind itself, then check below
                        run([self.kind_bin, "delete", "cluster", "--name", self.name], check=False, timeout=300)
                left = self.node_containers()
                if left:
                    raise BackendError(f"kind left containers of cluster {self.name} behind: {sorted(left)}")
            elif self.created:
                print(
                    f"\ndevplug: keeping kind cluster {self.name} (--keep-cluster); delete it with: "
                    f"{self.kind_bin} delete cluster --name {self.name}",
                    file=sys.stderr,
                )
        finally:
            if self._workdir is not None:
                shutil.rmtree(self._workdir, ignore_errors=True)
                self._workdir = None
            if self._pytest_kind_dir is not None:
                shutil.rmtree(self._pytest_kind_dir, ignore_errors=True)
                try:
                    self._pytest_kind_dir.parent.rmdir()  # .pytest-kind, when nothing else is in it
                except OSError:
                    pass
