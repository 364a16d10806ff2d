"""The ``cluster`` backend: the suite on an existing cluster (the kubeconfig's), through the Kubernetes API only.

It is :class:`~.k8s.backend.KubeBackend` with a :class:`KubeconfigProvider`: the cluster is never created or
deleted, images come from its registries (or were loaded onto the nodes by the user: ``--devplug-plugin-image``),
and a node is reached through a privileged host-PID pod (:mod:`.k8s.hostpod`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .base import BackendOptions, PluginSpec
from ..errors import BackendUnavailableError
from .k8s.api import KubeApi
from .k8s.backend import KubeBackend
from .k8s.hostpod import HostPodTransport
from .k8s.nodeops import NodeTransport

__all__ = ["KubeconfigProvider", "cluster_backend"]


class KubeconfigProvider:
    """The cluster of a kubeconfig (``--kubeconfig``, ``--kube-context``), as it is."""

    name = "cluster"
    nodes_are_containers = False

    @property
    def routes_services(self) -> bool:
        """A working cluster routes the ``kubernetes`` Service for its pods."""
        return True

    def __init__(self, options: BackendOptions) -> None:
        self.options = options

    def start(self) -> Any:
        import kubernetes

        try:
            return kubernetes.config.new_client_from_config(  # type: ignore[no-untyped-call]
                config_file=self.options.kubeconfig, context=self.options.kube_context
            )
        except Exception as exc:  # noqa: BLE001 - the loader raises ConfigException, OSError, TypeError
            raise BackendUnavailableError(f"cluster backend: cannot load kubeconfig {self.describe()}: {exc}") from None

    def transport(self, api: KubeApi, namespace: str, node_image: Callable[[], str]) -> NodeTransport:
        return HostPodTransport(api, namespace, node_image, self.options.timeout)

    def plugin_image(self, spec: PluginSpec, node: str) -> str:
        if not spec.image:
            raise BackendUnavailableError(
                "cluster backend: pass --devplug-plugin-image (an image the cluster can pull; for the included "
                "plugin build plugin_under_test/Dockerfile and push or load it), or adopt a running plugin with "
                "--devplug-plugin-daemonset NAMESPACE/NAME"
            )
        return spec.image

    def workload_image(self, image: str, node: str | None) -> str | None:
        return self.options.workload_image

    def disposes_cluster(self) -> bool:
        return False

    def describe(self) -> str:
        return self.options.kubeconfig or "$KUBECONFIG or ~/.kube/config"

    def close(self) -> None:
        """Nothing: the cluster is the user's."""


def cluster_backend(options: BackendOptions) -> KubeBackend:
    """The ``cluster`` backend (not started)."""
    return KubeBackend(options, KubeconfigProvider(options))
