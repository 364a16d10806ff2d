"""The kind backend: NOT IMPLEMENTED YET (a later issue builds it). Selecting it fails clearly.

What it will do, so the protocol stays honest about it: create or reuse a kind cluster with
pytest-kind-ng's options (``--cluster-name``, ``--keep-cluster``, ``--kind-bin``, ``--kind-image``,
``--kubeconfig``); deploy the plugin by applying ``PluginSpec.manifest`` with ``PluginSpec.image``
loaded into the nodes; pods through the Kubernetes API as the same JSON manifests; ``exec`` through
the API's exec; the checkpoint, the mock-state file and the kubelet log read from the node container
(``docker exec``); pod-resources through a small client run on the node.
"""

from __future__ import annotations

from typing import NoReturn

from .base import BackendOptions, BackendUnavailableError

__all__ = ["KindBackend", "KindBackendNotImplementedError"]


class KindBackendNotImplementedError(BackendUnavailableError):
    """Raised by every operation of the kind backend until it is implemented."""


MESSAGE = (
    "the kind backend of pytest-devplug is not implemented yet (a later release adds it); "
    "run with --devplug-backend sim (the default, the embedded kubelet) meanwhile"
)


class KindBackend:
    """Placeholder that refuses to start; see the module docstring for the planned behaviour."""

    name = "kind"

    def __init__(self, options: BackendOptions) -> None:
        self.options = options

    def start(self) -> NoReturn:
        raise KindBackendNotImplementedError(MESSAGE)

    def close(self) -> None:
        """Nothing was started, so there is nothing to tear down."""

    def __getattr__(self, name: str) -> NoReturn:
        raise KindBackendNotImplementedError(f"{MESSAGE} (called {name})")
