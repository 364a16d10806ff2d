"""Deploying the plugin under test on kind: its image (built here for the included plugin), its DaemonSet.

The included plugin's image is built from ``plugin_under_test/`` on the standard ``python:3.12-slim``,
or on the local Python base where the offline scripts made one (no registry); it is tagged by a hash of
its inputs, so a second session does not rebuild it. A user's plugin comes as ``--devplug-plugin-image``
(present locally or pullable) and ``--devplug-plugin-manifest`` (a DaemonSet).
"""

from __future__ import annotations

import copy
import hashlib
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml

from ..base import BackendError, BackendUnavailableError, PluginSpec
from .cluster import REPO_ROOT, image_prefix, python_base_image
from .proc import run

__all__ = ["PluginImage", "render_daemonsets", "STOP_LABEL", "selector_of", "MOCK_LIB_DIR", "mock_library_file"]

PLUGIN_SRC = REPO_ROOT / "plugin_under_test" if REPO_ROOT else None
DEFAULT_MANIFEST = PLUGIN_SRC / "deploy" / "daemonset.yaml" if PLUGIN_SRC else None
#: nodeSelector key the backend adds to stop the plugin (its pods go away) and removes to start it again.
STOP_LABEL = "devplug.io/plugin-stopped"
STANDARD_BASE = "python:3.12-slim"
#: On the node (hostPath), for plugins deployed with mock NVML: the state file and the mock library.
MOCK_DIR = "/var/lib/devplug"
MOCK_LIB_DIR = f"{MOCK_DIR}/lib"


def _inputs_hash(base: str) -> str:
    assert PLUGIN_SRC is not None
    h = hashlib.sha256(base.encode())
    for path in sorted([PLUGIN_SRC / "Dockerfile", PLUGIN_SRC / "pyproject.toml", *(PLUGIN_SRC / "src").rglob("*.py")]):
        h.update(str(path.relative_to(PLUGIN_SRC)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


def _image_present(image: str) -> bool:
    return run(["docker", "image", "inspect", image], check=False, timeout=60).returncode == 0


class PluginImage:
    """Resolves (and builds, for the included plugin) the image to load into the cluster."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.built: str | None = None

    def resolve(self, spec: PluginSpec) -> str:
        if spec.image:
            if not _image_present(spec.image):
                pulled = run(["docker", "pull", spec.image], check=False, timeout=600)
                if pulled.returncode != 0:
                    raise BackendError(f"plugin image {spec.image} is neither local nor pullable: {pulled.stderr[-1500:]}")
            return spec.image
        return self.included()

    def included(self) -> str:
        """The included GPU plugin's image, built once per inputs (Dockerfile, sources, base)."""
        if self.built:
            return self.built
        if PLUGIN_SRC is None:
            raise BackendUnavailableError(
                "the included GPU plugin's image is built from a pytest-devplug checkout (plugin_under_test/); "
                "pass --devplug-plugin-image and --devplug-plugin-manifest for your own plugin"
            )
        base = python_base_image() or STANDARD_BASE
        tag = f"{image_prefix()}/gpu-plugin:{_inputs_hash(base)}"
        if not _image_present(tag):
            ctx = self.workdir / "plugin-image"
            shutil.rmtree(ctx, ignore_errors=True)
            (ctx / "dist").mkdir(parents=True)
            shutil.copy(PLUGIN_SRC / "Dockerfile", ctx / "Dockerfile")
            # The local base (no registry) cannot reach PyPI from inside `docker build`: bake every wheel in
            # (the base's Python is Debian's, the same minor as the offline tooling's). The standard base
            # installs the dependencies from PyPI itself.
            deps = [] if base != STANDARD_BASE else ["--no-deps"]
            run([sys.executable, "-m", "pip", "wheel", *deps, "-q", "-w", str(ctx / "dist"), str(PLUGIN_SRC)], timeout=900)
            run(["docker", "build", "-q", "--build-arg", f"BASE_IMAGE={base}", "-t", tag, str(ctx)], timeout=1800)
            shutil.rmtree(ctx, ignore_errors=True)
        self.built = tag
        return tag


def selector_of(ds: dict[str, Any]) -> str:
    labels = ds["spec"]["selector"].get("matchLabels") or {}
    if not labels:
        raise BackendError(f"DaemonSet {ds['metadata']['name']} has no spec.selector.matchLabels (needed to find its pods)")
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _set_env(container: dict[str, Any], name: str, value: str) -> None:
    env = container.setdefault("env", [])
    for e in env:
        if e.get("name") == name:
            e.pop("valueFrom", None)
            e["value"] = value
            return
    env.append({"name": name, "value": value})


def mock_library_file() -> tuple[str, bytes]:
    """Where the mock libnvidia-ml.so.1 goes on a node, and its bytes (built on this machine; the plugin
    images are glibc-based, as is the host)."""
    from ...nvml import LIB_NAME, MockBuildError, mock_library

    try:
        return f"{MOCK_LIB_DIR}/{LIB_NAME}", mock_library().read_bytes()
    except MockBuildError as exc:
        raise BackendError(f"cannot give the plugin the mock NVML: {exc}") from None


def _hand_mock_nvml(pod: dict[str, Any], container: dict[str, Any]) -> None:
    """Give a container the mock libnvidia-ml.so.1 and its state: the node's /var/lib/devplug (hostPath)
    mounted at the same path, the library's directory on ``LD_LIBRARY_PATH``, the state file named."""
    _set_env(container, "LD_LIBRARY_PATH", MOCK_LIB_DIR)
    _set_env(container, "DEVPLUG_NVML_STATE", f"{MOCK_DIR}/mock-state.json")
    if any(m.get("mountPath") == MOCK_DIR for m in container.get("volumeMounts") or []):
        return
    volumes = pod.setdefault("volumes", [])
    if not any(v.get("name") == "devplug-mock-nvml" for v in volumes):
        volumes.append({"name": "devplug-mock-nvml", "hostPath": {"path": MOCK_DIR, "type": "DirectoryOrCreate"}})
    container.setdefault("volumeMounts", []).append({"name": "devplug-mock-nvml", "mountPath": MOCK_DIR})


def render_daemonsets(spec: PluginSpec, image: str) -> list[dict[str, Any]]:
    """The DaemonSet(s) to apply: the manifest with its container images set to ``image``.

    For the included plugin's own manifest the spec's resource name, ``pre_start_required`` and extra
    env are set through its ``DP_*`` variables (the sim passes the same as flags). With ``spec.mock``
    every container gets the mock NVML (any plugin that loads libnvidia-ml.so.1).
    """
    path = Path(spec.manifest) if spec.manifest else DEFAULT_MANIFEST
    if path is None or not path.is_file():
        raise BackendUnavailableError(f"no plugin manifest: {path} (pass --devplug-plugin-manifest)")
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    others = [f"{d.get('kind')}/{d.get('metadata', {}).get('name')}" for d in docs if d.get("kind") != "DaemonSet"]
    if others or not docs:
        raise BackendError(f"{path}: the kind backend deploys DaemonSets only; found {others or 'nothing'}")
    included = spec.manifest is None
    out = []
    for d in docs:
        d = copy.deepcopy(d)
        d.setdefault("metadata", {}).setdefault("namespace", "default")
        pod = d["spec"]["template"]["spec"]
        for c in [*(pod.get("initContainers") or []), *pod.get("containers", [])]:
            c["image"] = image
            c["imagePullPolicy"] = "IfNotPresent"
            if included:
                _set_env(c, "DP_RESOURCE_NAME", spec.resource_name)
                _set_env(c, "DP_PRE_START_REQUIRED", "true" if spec.pre_start_required else "false")
                if not spec.mock:  # real GPUs: the plugin's own default, real NVML, no stand-in device nodes
                    _set_env(c, "DP_NVML", "real")
                    _set_env(c, "DP_CREATE_DEV_NODES", "false")
            if spec.mock:
                _hand_mock_nvml(pod, c)
            for k, v in spec.env.items():
                _set_env(c, k, v)
        out.append(d)
    return out
