"""Errors of the embedded kubelet and its control plane, carrying upstream reasons and texts."""

from __future__ import annotations

from ..errors import DevplugError

__all__ = ["SimError", "AdmissionError", "ApiError", "NotFoundError", "PluginProcessError", "NamespaceUnavailableError", "PreStartError"]


class SimError(DevplugError):
    """Base of every error raised by the embedded kubelet."""


class AdmissionError(SimError):
    """The kubelet rejected a pod: ``reason`` and ``message`` as they appear in the pod status
    (``message`` without the ``Pod was rejected: `` prefix, which the kubelet adds)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


class ApiError(SimError):
    """The API server refused a request (``status`` 422 for validation, 409 for conflicts)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message


class NotFoundError(ApiError):
    def __init__(self, kind: str, name: str) -> None:
        super().__init__(404, "NotFound", f'{kind} "{name}" not found')


class PluginProcessError(SimError):
    """A plugin subprocess could not be started or did not behave (exit, timeout)."""


class NamespaceUnavailableError(PluginProcessError):
    """A plugin that needs the kubelet's standard paths cannot get its private mount namespace here
    (neither root nor unprivileged user namespaces); the message names both ways out."""


class PreStartError(SimError):
    """``PreStartContainer`` could not be done for a container, so the kubelet does not start it
    (upstream: the error of ``GetDeviceRunContainerOptions``, e.g. ``device plugin PreStartContainer
    rpc failed with err: ...``)."""
