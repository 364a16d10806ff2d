"""The ``kind`` backend: the Kubernetes backend plus kind's lifecycle (see the package docstring for the pieces).

:class:`KindProvider` gives :class:`~..k8s.backend.KubeBackend` a kind cluster (created, reused or kept:
:class:`~.lifecycle.ClusterManager`), loads images into it (the included plugin's is built here) and reaches
a node by ``docker exec`` into its container.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..base import BackendOptions, PluginSpec
from ..k8s.api import KubeApi
from ..k8s.backend import KubeBackend
from ..k8s.nodeops import NodeTransport
from .lifecycle import ClusterManager, python_base_image
from .deploy import PluginImage
from .transport import DockerExecTransport

__all__ = ["KindProvider", "kind_backend"]


class KindProvider:
    """A kind cluster for the session, images loaded into it, nodes reached through their containers."""

    name = "kind"
    nodes_are_containers = True

    def __init__(self, options: BackendOptions, *, config: str | None = None) -> None:
        """``config``: a kind config (path or file name in kind-config/); default ``$DEVPLUG_KIND_CONFIG`` or
        single-node."""
        self.options = options
        self.cluster = ClusterManager(options, config=config)
        self.workdir = Path(tempfile.mkdtemp(prefix="devplug-kindb-", dir="/tmp"))
        self.images = PluginImage(self.workdir)
        self._loaded: set[tuple[str, str | None]] = set()

    @property
    def routes_services(self) -> bool:
        """kind's own node image runs kube-proxy; the offline one has none (no image for it is built)."""
        return not self.cluster.offline

    def start(self) -> Any:
        self.cluster.start()
        return self.cluster.api_client()

    def transport(self, api: KubeApi, namespace: str, node_image: Callable[[], str]) -> NodeTransport:
        return DockerExecTransport(self.workdir, helper_image=lambda: self.images.built)

    def load_image(self, image: str, node: str | None = None) -> None:
        """``kind load docker-image`` into ``node`` (``None``: every node), once per run: on a cluster several runs
        share, each loads only where it runs (kind skips a node that has the image already)."""
        if (image, node) not in self._loaded and (image, None) not in self._loaded:
            self.cluster.load_image(image, [node] if node else [])
            self._loaded.add((image, node))

    def plugin_image(self, spec: PluginSpec, node: str) -> str:
        image = self.images.resolve(spec)
        self.load_image(image, node)
        return image

    def workload_image(self, image: str, node: str | None) -> str | None:
        """``--devplug-workload-image``; with no registry (offline node image) the local Python base, which has
        the shell tools test pods use (sh, sleep, env, ls, cat)."""
        local = self.options.workload_image or (python_base_image() if self.cluster.offline else None)
        if local:
            self.load_image(local, node)
        return local

    def disposes_cluster(self) -> bool:
        return self.cluster.created and not self.options.keep_cluster

    def describe(self) -> str:
        return f"kind cluster {self.cluster.name}"

    def close(self) -> None:
        try:
            self.cluster.close()
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)


def kind_backend(options: BackendOptions, *, config: str | None = None) -> KubeBackend:
    """The ``kind`` backend (not started); ``config`` as for :class:`KindProvider`."""
    return KubeBackend(options, KindProvider(options, config=config))
