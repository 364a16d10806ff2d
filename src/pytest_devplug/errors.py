"""The public exceptions of pytest-devplug, under one root: ``except DevplugError`` catches every error the
harness raises on purpose, and each kind of failure is a type a caller can tell apart without reading the
message (e.g. :class:`ObjectNotFoundError` for "not found").

Every exception class of the package is defined here, and imported from here (or the package root) only: the
modules that raise them do not re-export them. Internal errors (the embedded kubelet's, the control plane's, the
checkpoint codec's) follow the public ones; the two scripts run by path with the standard library only
(``procs/launcher.py``, ``nvml/smi.py``) keep theirs.

:class:`Evidence`, what a :class:`DevplugAssertionError` carries, lives here too (``evidence`` re-exports it): the
evidence module reads the cluster through ``backends``, which raise these errors, so it cannot be imported here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

__all__ = [
    "Evidence",
    "DevplugError",
    "DevplugAssertionError",
    "PluginNotReadyError",
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


class PluginNotReadyError(DevplugError, AssertionError):
    """The plugin or DRA driver under test did not come up in an earlier test's set-up, whose report has the
    details; a test asking for it since fails at once, pointing there (an ``AssertionError``: a failed test)."""


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


# --- the Go JSON codec -----------------------------------------------------------------------------------


class GoJSONSyntaxError(ValueError):
    """The input is not JSON as Go's ``encoding/json`` reads it."""


# --- quantities ------------------------------------------------------------------------------------------


class QuantityError(DevplugError, ValueError):
    """Not a quantity; the message names the input and the pattern quantities must match (``pattern``:
    ``kubeletmodel.quantity.QUANTITY_REGEX_TEXT``, upstream's text)."""

    def __init__(self, raw: object, pattern: str) -> None:
        super().__init__(f"{raw!r} is not a quantity: quantities must match the regular expression '{pattern}'")
        self.raw = raw


# --- the device manager's checkpoint file ----------------------------------------------------------------


class CheckpointError(DevplugError):
    """A checkpoint file could not be used."""


class CheckpointFormatError(CheckpointError, ValueError):
    """The file is not a device-manager checkpoint (bad JSON or wrong shape); a ``ValueError`` too, as
    :func:`~pytest_devplug.kubeletmodel.checkpoint.parse_checkpoint` raised before it decoded by Go's rules."""


class CheckpointCorruptError(CheckpointError):
    """The stored checksum does not match the data: the kubelet discards such a file."""

    def __init__(self, path: str, stored: int, computed: int) -> None:
        super().__init__(
            f"{path}: checksum mismatch: stored {stored}, computed {computed} "
            "(the kubelet logs this and starts with empty device state)"
        )
        self.stored = stored
        self.computed = computed


# --- CDI -------------------------------------------------------------------------------------------------


class CdiSpecError(ValueError):
    """A spec file is unreadable or invalid; the message names the file and the rule it breaks."""


class UnresolvableCdiDevicesError(LookupError):
    """Device names no spec resolves: the runtime would refuse to create the container."""

    def __init__(self, names: Sequence[str], seen: Mapping[str, str]) -> None:
        self.names, self.seen = list(names), dict(seen)
        specs = "; ".join(f"{path}: {what}" for path, what in sorted(self.seen.items())) or "no spec files"
        super().__init__(f"unresolvable CDI devices {', '.join(self.names)}; specs seen: {specs}")


# --- Kubernetes releases ---------------------------------------------------------------------------------


class VersionError(ValueError):
    """An unknown Kubernetes version or a feature-gate setting that release refuses; the text says which."""


# --- the API server client -------------------------------------------------------------------------------


class RestError(DevplugError):
    """The API server refused a request; ``str()`` is its own message (e.g. ``resourceclaims.resource.k8s.io "x"
    not found``), as client-go's error reads. ``details``: the Status's ``details`` (``kind``, ``name``, ...)."""

    def __init__(self, status: int, reason: str, message: str, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message
        self.details = dict(details or {})

    @property
    def not_found(self) -> bool:
        return self.status == 404


# --- device backings -------------------------------------------------------------------------------------


class UnknownBackingError(LookupError):
    """A device ID is backed by no single mock GPU that the harness can tell (the message says why)."""


# --- NVML ------------------------------------------------------------------------------------------------


class NvmlError(DevplugError):
    """An NVML call returned an error code; ``code`` is NVML's value, the message its name."""

    def __init__(self, call: str, code: int, text: str) -> None:
        super().__init__(f"{call}: {text} ({code})")
        self.code = code
        self.text = text


# --- real nodes ------------------------------------------------------------------------------------------


class NodeGrpcError(BackendError):
    """The service at a node's socket answered a gRPC error (``code``: its name, ``UNIMPLEMENTED``; ``STREAM_ENDED``: a
    server stream ended before its first message)."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"rpc error: code = {code} desc = {details}")
        self.code = code
        self.details = details

    @classmethod
    def from_stderr(cls, text: str) -> NodeGrpcError | None:
        """The error ``backends.k8s.nodeops.GRPC_CALL`` reported on stderr, if it did."""
        marker = text.rfind("RPCERROR ")
        if marker < 0:
            return None
        code, _, details = text[marker + len("RPCERROR ") :].partition(" ")
        return cls(code, details.strip())


class NodeCommandError(BackendError):
    """A command on the node ran and failed (as opposed to the node not being reachable)."""


# --- kind ------------------------------------------------------------------------------------------------


class ToolError(BackendError):
    """A host command (``kind``, ``docker``) failed; the message carries its exit status and output tail."""


# --- the real control plane ------------------------------------------------------------------------------


class ControlPlaneError(DevplugError):
    """The real control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager) failed."""


class BinariesNotFoundError(ControlPlaneError):
    """A component's binary is in none of the sources; the message names them and the ways out."""


class ComponentFailedError(ControlPlaneError):
    """A component exited or did not become ready; the message carries its log tail."""


# --- the embedded kubelet --------------------------------------------------------------------------------


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
    """The embedded API server has no such object (404, upstream's ``<kind> "<name>" not found``)."""

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


class PluginHandlerError(SimError):
    """A handler refused a plugin; the text is upstream's (the watcher tells the plugin)."""


class RegistrationError(PluginHandlerError):
    """A registration was refused; the text is what the plugin receives."""


class DRAPluginCallError(SimError):
    """A call to a DRA plugin failed as a whole; ``str()`` is grpc-go's rendering of the status."""


class DRAManagerError(SimError):
    """The DRA manager cannot start (its checkpoint cannot be read)."""


class DRAPrepareError(SimError):
    """Preparing or unpreparing a pod's claims failed; the text is the kubelet's (the pod worker retries)."""


class DRAPluginError(PluginHandlerError):
    """A DRA plugin cannot be registered or used; the text is upstream's."""


class PciNodeError(ValueError):
    """The PCI node file is not usable; the text names the file, the function and the problem."""


class EndpointError(SimError):
    """An RPC to a plugin failed; ``str()`` is the text the kubelet would put in its error."""


class SocketPathTooLongError(SimError):
    """A Unix socket path longer than the kernel accepts (107 bytes)."""


class AllocateError(SimError):
    """``devicesToAllocate``/``allocateContainerResources`` failed; the text is upstream's."""
