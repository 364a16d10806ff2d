"""Backends: the same fixtures on the embedded kubelet (``sim``), a kind cluster (``kind``) or any cluster
(``cluster``)."""

from __future__ import annotations

from .base import Backend, BackendOptions
from ..errors import BackendUnavailableError
from .extras import CLUSTER_MODULES, KIND_MODULES, missing_kind_dependencies, require_extra

__all__ = ["BACKENDS", "CLUSTER_MODULES", "KIND_MODULES", "create_backend", "missing_kind_dependencies"]

BACKENDS = ("sim", "kind", "cluster")


def create_backend(name: str, options: BackendOptions) -> Backend:
    """Instantiate backend ``name`` (not started yet). Imports lazily so ``sim`` needs no kind tooling."""
    if name == "sim":
        from .sim import SimBackend

        return SimBackend(options)
    if name == "kind":
        require_extra("kind", "kind", KIND_MODULES)
        from .kind import kind_backend

        return kind_backend(options)
    if name == "cluster":
        require_extra("cluster", "cluster", CLUSTER_MODULES)
        from .cluster import cluster_backend

        return cluster_backend(options)
    raise BackendUnavailableError(f"unknown devplug backend {name!r}; choose one of {', '.join(BACKENDS)}")
