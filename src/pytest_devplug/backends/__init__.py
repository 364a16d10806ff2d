"""Backends: the same fixtures on the embedded kubelet (``sim``) or a kind cluster (``kind``)."""

from __future__ import annotations

from .base import Backend, BackendOptions, BackendUnavailableError

__all__ = ["BACKENDS", "create_backend"]

BACKENDS = ("sim", "kind")


def create_backend(name: str, options: BackendOptions) -> Backend:
    """Instantiate backend ``name`` (not started yet). Imports lazily so ``sim`` needs no kind tooling."""
    if name == "sim":
        from .sim import SimBackend

        return SimBackend(options)
    if name == "kind":
        from .kind import KindBackend

        return KindBackend(options)
    raise BackendUnavailableError(f"unknown devplug backend {name!r}; choose one of {', '.join(BACKENDS)}")
