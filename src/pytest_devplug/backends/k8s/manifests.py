"""The plugin's DaemonSets on a real cluster: the manifest rendered for the spec, owned by the run, pinned to a node.

The included plugin's manifest is ``plugin_under_test/deploy/daemonset.yaml`` (a checkout); a user's plugin
comes as ``--devplug-plugin-manifest``. With ``spec.mock`` any plugin that loads libnvidia-ml.so.1 gets the
mock library and its state from the node's ``/var/lib/devplug`` (hostPath).
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from ..base import PluginSpec
from ...errors import BackendError, BackendUnavailableError

__all__ = [
    "REPO_ROOT",
    "PLUGIN_SRC",
    "GPU_LABEL",
    "STOP_LABEL",
    "NODE_KEY_LABEL",
    "MOCK_DIR",
    "MOCK_LIB_DIR",
    "selector_of",
    "set_env",
    "hand_mock_nvml",
    "mock_library_file",
    "render_daemonsets",
    "own_daemonset",
]

#: The repository root when running from a checkout (src layout), else ``None``.
_root = Path(__file__).resolve().parents[4]
REPO_ROOT: Path | None = _root if (_root / "kind-config").is_dir() else None
PLUGIN_SRC = REPO_ROOT / "plugin_under_test" if REPO_ROOT else None
DEFAULT_MANIFEST = PLUGIN_SRC / "deploy" / "daemonset.yaml" if PLUGIN_SRC else None
#: Nodes that carry the resource under test (kind-config/*.yaml label them; a real cluster may not).
GPU_LABEL = ("devplug.io/gpu", "true")
#: nodeSelector key the backend adds to stop the plugin (its pods go away) and removes to start it again.
STOP_LABEL = "devplug.io/plugin-stopped"
#: Label of a deployed plugin's pods (and its DaemonSet's selector): a key of the node it is pinned to.
NODE_KEY_LABEL = "devplug.io/plugin-node"
#: On the node (hostPath), for plugins deployed with mock NVML: the state file and the mock library.
MOCK_DIR = "/var/lib/devplug"
MOCK_LIB_DIR = f"{MOCK_DIR}/lib"


def selector_of(ds: dict[str, Any]) -> str:
    labels = ds["spec"]["selector"].get("matchLabels") or {}
    if not labels:
        raise BackendError(
            f"DaemonSet {ds['metadata']['name']} has no spec.selector.matchLabels (needed to find its pods)"
        )
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def set_env(container: dict[str, Any], name: str, value: str) -> None:
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
    from ...nvml import LIB_NAME, mock_library
    from ...errors import MockBuildError

    try:
        return f"{MOCK_LIB_DIR}/{LIB_NAME}", mock_library().read_bytes()
    except MockBuildError as exc:
        raise BackendError(f"cannot give the plugin the mock NVML: {exc}") from None


def hand_mock_nvml(
    pod: dict[str, Any], container: dict[str, Any], state_path: str = f"{MOCK_DIR}/mock-state.json"
) -> None:
    """Give a container the mock libnvidia-ml.so.1 and its state: the node's /var/lib/devplug (hostPath)
    mounted at the same path, the library's directory on ``LD_LIBRARY_PATH``, the state file named."""
    set_env(container, "LD_LIBRARY_PATH", MOCK_LIB_DIR)
    set_env(container, "DEVPLUG_NVML_STATE", state_path)
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
        raise BackendError(f"{path}: the plugin is deployed from DaemonSets only; found {others or 'nothing'}")
    included = spec.manifest is None
    out = []
    for d in docs:
        d = copy.deepcopy(d)
        d.setdefault("metadata", {})
        pod = d["spec"]["template"]["spec"]
        for c in [*(pod.get("initContainers") or []), *pod.get("containers", [])]:
            c["image"] = image
            c["imagePullPolicy"] = "IfNotPresent"
            if included:
                set_env(c, "DP_RESOURCE_NAME", spec.resource_name)
                set_env(c, "DP_PRE_START_REQUIRED", "true" if spec.pre_start_required else "false")
                if not spec.mock:  # real GPUs: the plugin's own default, real NVML, no stand-in device nodes
                    set_env(c, "DP_NVML", "real")
                    set_env(c, "DP_CREATE_DEV_NODES", "false")
            if spec.mock:
                hand_mock_nvml(pod, c)
            for k, v in spec.env.items():
                set_env(c, k, v)
        out.append(d)
    return out


def own_daemonset(
    ds: dict[str, Any], namespace: str, node: str, labels: dict[str, str], *, tolerations: Sequence[dict[str, Any]] = ()
) -> dict[str, Any]:
    """``ds`` moved into the run's ``namespace`` with the run's ``labels``, its pods on ``node`` only.

    The manifest's own node selection (the included one's kind label) gives way to the node's hostname:
    a real node may lack the label, and on a cluster shared by several runs each plugin stays on its node.
    A run may deploy on two nodes (the soak's copy): the name and the pod selector carry the node's key, so
    the two DaemonSets neither replace nor adopt each other. ``tolerations``: added to the pods' own
    (those of the node's configured taints, :func:`~pytest_devplug.backends.base.node_tolerations`).
    """
    key = hashlib.sha256(node.encode()).hexdigest()[:8]
    meta = ds["metadata"]
    meta["namespace"] = namespace
    meta["name"] = f"{meta['name']}-{key}"
    meta.setdefault("labels", {}).update(labels)
    ds["spec"].setdefault("selector", {}).setdefault("matchLabels", {})[NODE_KEY_LABEL] = key
    ds["spec"]["template"].setdefault("metadata", {}).setdefault("labels", {})[NODE_KEY_LABEL] = key
    pod = ds["spec"]["template"]["spec"]
    pod.setdefault("tolerations", []).extend(dict(t) for t in tolerations if t not in pod.get("tolerations", []))
    pod = ds["spec"]["template"]["spec"]
    selector = dict(pod.get("nodeSelector") or {})
    selector.pop(GPU_LABEL[0], None)
    selector["kubernetes.io/hostname"] = node
    pod["nodeSelector"] = selector
    return ds
