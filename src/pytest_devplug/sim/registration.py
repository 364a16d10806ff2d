"""The two ways a device plugin registers with the kubelet: ``Register`` on ``<plugin dir>/kubelet.sock``, and a
socket in ``plugins_registry/`` found by the plugin watcher.

``Register`` mirrors upstream ``plugin/v1beta1/server.go``: the version and the resource name are checked
first, then the plugin is connected synchronously (dial, GetDevicePluginOptions) so that a
failure reaches the plugin as the error of its ``Register`` call. grpc-go turns a plain Go error
returned by a handler into status ``Unknown`` with the error text as description; this server
answers the same way.

The watcher's way is ``plugin/v1beta1/handler.go`` (:class:`WatcherHandler`): ``GetInfo`` names the type
``DevicePlugin``, the resource as the plugin's name and the socket the kubelet dials (an absolute path; empty: the
registration socket itself); any one of the plugin's versions must be the kubelet's; the connection is the same as
``Register``'s, and the socket's removal disconnects the plugin. No ``DEPRECATION`` file is made in the device-plugin
directory: upstream's ``GetPluginHandler``, which would make one, is called nowhere in the kubelet (1.34 to 1.38), and
upstream's stub skips ``Register`` where it finds one.

grpc-go serves every call on its own goroutine, so a plugin whose socket never answers holds
only its own ``Register`` (for up to the 10 s dial timeout); the thread pool here is sized so
that stuck plugins cannot queue a healthy one behind them either.
"""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Callable, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from pytest_devplug.api.deviceplugin import v1beta1_pb2 as pb
from pytest_devplug.api.deviceplugin import v1beta1_pb2_grpc as pb_grpc
from pytest_devplug.sim.names import is_extended_resource_name
from pytest_devplug.errors import RegistrationError
from pytest_devplug.procs.workdir import check_socket_path

__all__ = [
    "SUPPORTED_VERSIONS",
    "RegistrationServer",
    "WatcherHandler",
    "is_extended_resource_name",
    "unsupported_version_message",
    "invalid_resource_name_message",
    "plugin_socket_path",
]

SUPPORTED_VERSIONS = ("v1beta1",)
#: Register calls served at once. Each may wait out a dial (10 s); grpc-go has no limit at all,
#: and threads are only made when calls arrive.
MAX_CONCURRENT_REGISTRATIONS = 64


def _go_quote_list(values: tuple[str, ...]) -> str:
    # fmt's %q of a Go string array: ["a" "b"]
    return "[" + " ".join(f'"{v}"' for v in values) + "]"


def unsupported_version_message(version: str) -> str:
    """``errUnsupportedVersion`` formatted with ``api.SupportedVersions`` (a Go array, so ``%q``
    prints it as ``["v1beta1"]``)."""
    return (
        f'requested API version "{version}" is not supported by kubelet. '
        f"Supported version is {_go_quote_list(SUPPORTED_VERSIONS)}"
    )


def invalid_resource_name_message(name: str) -> str:
    return f'the ResourceName "{name}" is invalid'


def plugin_socket_path(plugin_dir: Path, endpoint: str) -> Path:
    """``filepath.Join(socketDir, endpoint)``: an absolute endpoint is taken as relative to the
    plugin directory, and the result is cleaned lexically (``a/../b`` is ``b``) as Go does."""
    return Path(posixpath.normpath(f"{plugin_dir}/{endpoint}"))


class _Servicer(pb_grpc.RegistrationServicer):
    def __init__(self, on_register: Callable[[pb.RegisterRequest], None], log: logging.Logger) -> None:
        self._on_register = on_register
        self._log = log

    def Register(self, request: pb.RegisterRequest, context: Any) -> pb.Empty:  # noqa: N802 (gRPC name)
        self._log.info("Got registration request from device plugin with resource %s", request.resource_name)
        if request.version not in SUPPORTED_VERSIONS:
            msg = unsupported_version_message(request.version)
            self._log.error(
                "Bad registration request from device plugin with resource %s: %s", request.resource_name, msg
            )
            context.abort(grpc.StatusCode.UNKNOWN, msg)
        if not is_extended_resource_name(request.resource_name):
            msg = invalid_resource_name_message(request.resource_name)
            self._log.error("Bad registration request from device plugin: %s", msg)
            context.abort(grpc.StatusCode.UNKNOWN, msg)
        try:
            self._on_register(request)
        except RegistrationError as err:
            self._log.error("Error connecting to device plugin client %s: %s", request.resource_name, err)
            context.abort(grpc.StatusCode.UNKNOWN, str(err))
        return pb.Empty()


class RegistrationServer:
    """Serves ``Registration`` on a Unix socket; ``on_register`` connects the plugin or raises
    :class:`RegistrationError`."""

    def __init__(
        self,
        socket_path: Path,
        on_register: Callable[[pb.RegisterRequest], None],
        *,
        logger: logging.Logger | None = None,
    ) -> None:
        self.socket_path = socket_path
        self._on_register = on_register
        self._log = logger or logging.getLogger(__name__)
        self._server: Any = None

    def start(self) -> None:
        pool = futures.ThreadPoolExecutor(max_workers=MAX_CONCURRENT_REGISTRATIONS, thread_name_prefix="registration")
        server = grpc.server(pool)
        pb_grpc.add_RegistrationServicer_to_server(  # type: ignore[no-untyped-call]
            _Servicer(self._on_register, self._log), server
        )
        check_socket_path(self.socket_path, "the kubelet's registration")
        if server.add_insecure_port(f"unix://{self.socket_path}") == 0:
            raise RegistrationError(
                f"failed to listen to socket {self.socket_path} while starting device plugin registry"
            )
        server.start()
        self._server = server
        self._log.info("Serving device plugin registration server on %s", self.socket_path)

    def stop(self) -> None:
        """Stop serving and remove the socket file, as closing a Go unix listener does."""
        if self._server is not None:
            self._server.stop(grace=None).wait(5.0)
            self._server = None
        self.socket_path.unlink(missing_ok=True)


def _go_list(values: Sequence[str]) -> str:
    """fmt's ``%v`` of a Go ``[]string``: ``[a b]``."""
    return "[" + " ".join(values) + "]"


class WatcherHandler:
    """``cache.PluginHandler`` for ``DevicePlugin`` sockets in ``plugins_registry/`` (upstream ``handler.go``).

    ``connect(resource, socket)`` is the device manager's connection (as for ``Register``; raises
    :class:`RegistrationError`), ``disconnect(resource, socket)`` its disconnection; ``path_of_endpoint`` maps the
    endpoint the plugin named (a path in its own mount namespace) to the socket on this host."""

    def __init__(
        self,
        connect: Callable[[str, Path], None],
        disconnect: Callable[[str, Path], None],
        *,
        path_of_endpoint: Callable[[str], Path] = Path,
        logger: logging.Logger | None = None,
    ) -> None:
        self._connect, self._disconnect, self._path = connect, disconnect, path_of_endpoint
        self._log = logger or logging.getLogger(__name__)

    def validate_plugin(self, name: str, endpoint: str, versions: Sequence[str]) -> None:
        self._log.info(
            '"Got plugin at endpoint with versions" plugin="%s" endpoint="%s" versions=%s',
            name,
            endpoint,
            _go_list(versions),
        )
        if not any(v in SUPPORTED_VERSIONS for v in versions):
            raise RegistrationError(
                f"manager version, {SUPPORTED_VERSIONS[0]}, is not among plugin supported versions {_go_list(versions)}"
            )
        if not is_extended_resource_name(name):
            raise RegistrationError(f"invalid name of device plugin socket: {invalid_resource_name_message(name)}")

    def register_plugin(self, name: str, endpoint: str, versions: Sequence[str], timeout: float | None) -> None:
        self._log.info('"Registering plugin at endpoint" plugin="%s" endpoint="%s"', name, endpoint)
        try:
            self._connect(name, self._path(endpoint))
        except RegistrationError as err:
            self._log.error(
                '"Failed to connect to new client" err="%s" resource="%s" socketPath="%s"', err, name, endpoint
            )
            raise

    def deregister_plugin(self, name: str, endpoint: str) -> None:
        self._log.info('"Deregistering plugin" plugin="%s" endpoint="%s"', name, endpoint)
        self._disconnect(name, self._path(endpoint))
