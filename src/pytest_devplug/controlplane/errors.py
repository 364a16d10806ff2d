"""The control plane's errors: one base, so a caller can catch "the real control plane could not run"."""

from __future__ import annotations

from ..errors import DevplugError

__all__ = ["BinariesNotFoundError", "ComponentFailedError", "ControlPlaneError"]


class ControlPlaneError(DevplugError):
    """The real control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager) failed."""


class BinariesNotFoundError(ControlPlaneError):
    """A component's binary is in none of the sources; the message names them and the ways out."""


class ComponentFailedError(ControlPlaneError):
    """A component exited or did not become ready; the message carries its log tail."""
