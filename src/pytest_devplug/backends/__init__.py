"""Backends: the same fixtures on the embedded kubelet (``sim``), a kind cluster (``kind``) or any cluster (``cluster``)."""

from __future__ import annotations

import importlib.util

from .base import Backend, BackendOptions, BackendUnavailableError

__all__ = ["BACKENDS", "create_backend"]

BACKENDS = ("sim", "kind", "cluster")

#: Modules the kind backend needs (the ``kind`` extra), by the distribution that provides them.
KIND_MODULES = {"pytest_kind": "pytest-kind-ng", "kubernetes": "kubernetes", "yaml": "pyyaml"}


def missing_kind_dependencies() -> list[str]:
    """Distributions of the ``kind`` extra that are not installed (none are imported to find out)."""
    return [dist for module, dist in KIND_MODULES.items() if importlib.util.find_spec(module) is None]


def create_backend(name: str, options: BackendOptions) -> Backend:
    """Instantiate backend ``name`` (not started yet). Imports lazily so ``sim`` needs no kind tooling."""
    if name == "sim":
        from .sim import SimBackend

        return SimBackend(options)
    if name == "kind":
        missing = missing_kind_dependencies()
        if missing:
            raise BackendUnavailableError(
                f"the kind backend needs {', '.join(missing)}, which are not installed: "
                "pip install 'pytest-devplug[kind]'"
            )
        from .kind import KindBackend

        return KindBackend(options)
    if name == "cluster":
        from .cluster import ClusterBackend

        return ClusterBackend(options)
    raise BackendUnavailableError(f"unknown devplug backend {name!r}; choose one of {', '.join(BACKENDS)}")
