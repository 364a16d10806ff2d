"""The public exceptions of pytest-devplug, under one root: ``except DevplugError`` catches every error the
harness raises on purpose, and each kind of failure is a type a caller can tell apart without reading the
message (e.g. :class:`ObjectNotFoundError` for "not found").

The modules that raise them re-export them where they lived before (``backends.base``, ``waiting``,
``faults``, ``handles``, ``evidence``, ``nvml``), so existing imports keep working. Errors internal to the
embedded kubelet (``sim.errors``) and the checkpoint codec derive from :class:`DevplugError` too.

:class:`Evidence`, what a :class:`DevplugAssertionError` carries, lives here too (``evidence`` re-exports it): the
evidence module reads the cluster through ``backends``, which raise these errors, so it cannot be imported here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = [
    "Evidence",
    "DevplugError",
    "DevplugAssertionError",
    "BackendError",
    "ClaimError",
    "BackendUnavailableError",
    "UnsupportedOperationError",
    "PodRejectedError",
    "ObjectNotFoundError",
    "ContainerStatusMissingError",
    "WaitTimeout",
    "WaitAbandoned",
    "FaultNotSupportedError",
    "MockControlsUnavailableError",
    "MockBuildError",
    "CompilerNotFoundError",
]

T = TypeVar("T")


@dataclass(frozen=True)
class Evidence:
    """One report section: ``title`` (prefixed ``devplug:`` in the report) and its text."""

    title: str
    text: str


class DevplugError(Exception):
    """Root of every exception pytest-devplug raises on purpose."""


class DevplugAssertionError(DevplugError, AssertionError):
    """An ``assert_*`` helper failed; ``evidence`` is what the cluster looked like at that moment.

    An ``AssertionError`` too, so pytest reports it as a failed test, not an error."""

    def __init__(self, message: str, evidence: Iterable[Evidence] = ()) -> None:
        super().__init__(message)
        self.evidence = list(evidence)


class BackendError(DevplugError):
    """A backend operation failed for a reason outside the plugin under test."""


class BackendUnavailableError(BackendError):
    """The selected backend cannot run here (not implemented yet, missing tool, no cluster)."""


class UnsupportedOperationError(BackendError):
    """The backend cannot answer this question honestly (e.g. an ``exec`` the sim cannot emulate)."""


class PodRejectedError(BackendError):
    """The API server refused a pod (``status`` 422 with the validation message)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class ObjectNotFoundError(BackendError):
    """The pod (or node) asked for does not exist."""


class ContainerStatusMissingError(DevplugError, KeyError):
    """The pod has no status for that container yet (the kubelet has not reported it); a ``KeyError`` as well, as
    it was before it had a type of its own."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""  # KeyError would quote the message


class WaitTimeout(DevplugError, Generic[T]):
    """The condition did not hold within ``timeout``; ``last`` is the last value seen (or ``None``)."""

    def __init__(self, what: str, timeout: float, last: T | None, last_error: BaseException | None) -> None:
        detail = f"; last value: {last!r}" if last_error is None else f"; last error: {last_error!r}"
        super().__init__(f"timed out after {timeout:g}s waiting for {what}{detail}")
        self.what = what
        self.timeout = timeout
        self.last = last
        self.last_error = last_error
        #: Why the wait stopped before its timeout (``None``: it timed out).
        self.reason: str | None = None


class WaitAbandoned(WaitTimeout[T]):
    """The wait stopped early because ``give_up`` said the condition can no longer come; ``reason`` says why."""

    def __init__(self, what: str, elapsed: float, last: T | None, reason: str) -> None:
        Exception.__init__(self, f"gave up after {elapsed:.1f}s waiting for {what}: {reason}; last value: {last!r}")
        self.what = what
        self.timeout = elapsed
        self.last = last
        self.last_error = None
        self.reason = reason


class ClaimError(DevplugError):
    """A pod's ResourceClaims cannot be resolved as the kubelet resolves them (a claim not created yet, no claim
    state for a container's claim); the text is the kubelet's."""


class FaultNotSupportedError(DevplugError, NotImplementedError):
    """An injector cannot make this fault for its plugin (e.g. a fixed device list: no add/remove).

    The tests that need that fault skip, quoting the message; the others still run.
    """


class MockControlsUnavailableError(DevplugError, RuntimeError):
    """The plugin under test was not deployed with the mock-NVML state file, so faults cannot be injected."""


class MockBuildError(DevplugError, RuntimeError):
    """The mock library could not be built; the message carries the compiler's output."""


class CompilerNotFoundError(MockBuildError):
    """No C compiler on this machine; the message says which names were tried and what to do."""
