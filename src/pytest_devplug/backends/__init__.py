"""Backends: the same fixtures on the embedded kubelet (``sim``), a kind cluster (``kind``) or any cluster (``cluster``)."""

from __future__ import annotations

import importlib.util

from .base import Backend, BackendOptions, BackendUnavailableError

__all__ = ["BACKENDS", "create_backend"]

BACKENDS = ("sim", "kind", "cluster")

#: Modules the cluster backend needs (the ``cluster`` extra), by the distribution that provides them.
CLUSTER_MODULES = {"kubernetes": "kubernetes", "yaml": "pyyaml"}
#: Modules the kind backend needs (the ``kind`` extra).
KIND_MODULES = {"pytest_kind": "pytest-kind-ng", **CLUSTER_MODULES}


def _missing(modules: dict[str, str]) -> list[str]:
    return [dist for module, dist in modules.items() if importlib.util.find_spec(module) is None]


def missing_kind_dependencies() -> list[str]:
    """Distributions of the ``kind`` extra that are not installed (none are imported to find out)."""
    return _missing(KIND_MODULES)


def _require(backend: str, extra: str, modules: dict[str, str]) -> None:
    missing = _missing(modules)
    if missing:
        raise BackendUnavailableError(
            f"the {backend} backend needs {', '.join(missing)}, which are not installed: "
            f"pip install 'pytest-devplug[{extra}]'"
        )


def create_backend(name: str, options: BackendOptions) -> Backend:
    """Instantiate backend ``name`` (not started yet). Imports lazily so ``sim`` needs no kind tooling."""
    if name == "sim":
        from .sim import SimBackend

        return SimBackend(options)
    if name == "kind":
        _require("kind", "kind", KIND_MODULES)
        from .kind import kind_backend

        return kind_backend(options)
    if name == "cluster":
        _require("cluster", "cluster", CLUSTER_MODULES)
        from .cluster import cluster_backend

        return cluster_backend(options)
    raise BackendUnavailableError(f"unknown devplug backend {name!r}; choose one of {', '.join(BACKENDS)}")
