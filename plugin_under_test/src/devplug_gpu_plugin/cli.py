"""Command line: flags with ``DP_*`` environment equivalents (for the DaemonSet) and ``main()``.

One program, two kubelet APIs on the same NVML layer: the device plugin (default) and, with ``--dra``,
a DRA driver (:mod:`devplug_gpu_plugin.dra`). Each mode's own flags are refused in the other.

Exit codes: 0 after SIGTERM/SIGINT; 2 for bad configuration (including a mock NVML that refuses
to start, e.g. on a malformed mock state, and a DRA driver with no way to the API server); 1 for
runtime failures (NVML missing, registration refused, cannot serve).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Protocol

from . import __name__ as _pkg
from .allocation import STRATEGIES, AllocationConfig, ensure_dev_nodes, write_cdi_spec
from .devices import DeviceState
from .health import DEFAULT_IGNORED_XIDS, HealthMonitor
from .mock_faults import MockFaults
from .server import (
    DevicePluginServicer,
    PluginServer,
    RegistrationRefused,
    ServerConfig,
    WatchedPluginServer,
    instance_socket_name,
)

log = logging.getLogger(_pkg)

PROG = "devplug-gpu-plugin"
TRUE = {"1", "true", "yes", "on"}
FALSE = {"0", "false", "no", "off", ""}


def _env(flag: str) -> str:
    return "DP_" + flag.lstrip("-").replace("-", "_").upper()


def _env_bool(flag: str) -> bool:
    raw = os.environ.get(_env(flag))
    if raw is None:
        return False
    value = raw.strip().lower()
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise SystemExit(f"{PROG}: error: {_env(flag)}={raw!r} is not a boolean (use true/false)")


def _split(values: Sequence[str]) -> list[str]:
    return [p.strip() for v in values for p in v.split(",") if p.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Kubernetes device plugin for NVIDIA GPUs on NVML, with a mock NVML for GPU-less nodes. "
        "Every flag can also be set by the environment variable shown (DP_<FLAG>).",
    )

    def opt(flag: str, default: str | None, help: str, **kw: object) -> None:
        env = _env(flag)
        p.add_argument(flag, default=os.environ.get(env, default), help=f"{help} [{env}]", **kw)  # type: ignore[arg-type]

    p.add_argument(
        "--dra",
        action="store_true",
        default=_env_bool("--dra"),
        help="run as a DRA driver (kubelet plugin, ResourceSlices, CDI specs per claim) instead of a device plugin "
        "(needs the dra extra: pip install 'devplug-gpu-plugin[dra]') [DP_DRA]",
    )
    opt("--plugin-dir", "/var/lib/kubelet/device-plugins", "kubelet device-plugin directory (default %(default)s)")
    opt("--resource-name", "nvidia.com/gpu", "extended resource to advertise (default %(default)s)")
    opt(
        "--nvml",
        "real",
        "real: NVML as on a GPU node; mock: the same NVML code on pytest-devplug's mock libnvidia-ml.so.1 "
        "(on LD_LIBRARY_PATH or --nvml-lib) fed by --mock-state",
        choices=["mock", "real"],
    )
    opt("--mock-state", None, "mock NVML state file (JSON, see README); required with --nvml mock")
    opt("--nvml-lib", None, "path of libnvidia-ml.so.1 (default: the loader's search)")
    p.add_argument(
        "--pre-start-required",
        action="store_true",
        default=_env_bool("--pre-start-required"),
        help="ask the kubelet to call PreStartContainer [DP_PRE_START_REQUIRED]",
    )
    opt(
        "--ignored-xids",
        ",".join(map(str, DEFAULT_IGNORED_XIDS)),
        "comma-separated Xids that do not make a GPU unhealthy (default %(default)s)",
    )
    p.add_argument(
        "--device-list-strategy",
        action="append",
        default=None,
        help=f"how containers get their GPUs: {', '.join(STRATEGIES)}; repeatable or comma-separated "
        "(default envvar) [DP_DEVICE_LIST_STRATEGY]",
    )
    opt("--cdi-spec-dir", "/var/run/cdi", "where the CDI spec is written for cdi-* strategies (default %(default)s)")
    opt("--driver-lib-dir", None, "host directory of driver libraries, mounted read-only at the same path")
    opt("--dev-root", "/dev", "host directory holding the nvidia* device nodes (default %(default)s)")
    p.add_argument(
        "--create-dev-nodes",
        action="store_true",
        default=_env_bool("--create-dev-nodes"),
        help="mock mode: create stand-in nvidia* device nodes under --dev-root [DP_CREATE_DEV_NODES]",
    )
    opt(
        "--replicas",
        "1",
        "device IDs advertised per GPU, <uuid>::<n> when > 1: containers share the GPU (time-slicing) "
        "(default %(default)s)",
    )
    opt(
        "--second-resource",
        None,
        "NAME=N: advertise the N GPUs with the highest minor numbers as a second extended resource NAME, from "
        "this same process (its own socket and registration), the others as --resource-name (as NVIDIA's mixed "
        "MIG strategy serves nvidia.com/gpu and nvidia.com/mig-* together); GPUs found later join --resource-name",
    )
    opt(
        "--socket-name",
        None,
        "plugin socket file name in --plugin-dir (default devplug-<resource>.sock, or a name of this process's "
        "own while another instance serves on that one: a rolling update)",
    )
    opt(
        "--registration",
        "kubelet.sock",
        "how the kubelet learns of the plugin: kubelet.sock (it calls Register there) or plugins_registry (its "
        "socket is put in --kubelet-registrar-dir, where the kubelet's plugin watcher finds it) (default %(default)s)",
        choices=REGISTRATIONS,
    )
    opt(
        "--kubelet-registrar-dir",
        DRA_DEFAULTS["kubelet_registrar_dir"],
        "where the kubelet's plugin watcher looks for registration sockets (default %(default)s)",
    )
    opt("--log-level", "info", "debug, info, warning or error (default %(default)s)")
    dra = p.add_argument_group("DRA driver (--dra)")

    def dra_opt(flag: str, default: str | None, help: str, env: str | None = None) -> None:
        env = env or _env(flag)
        dra.add_argument(flag, default=os.environ.get(env, default), help=f"{help} [{env}]")

    dra_opt("--driver-name", DRA_DEFAULTS["driver_name"], "DRA driver name, also the CDI vendor (default %(default)s)")
    dra_opt(
        "--node-name", None, "this node's name: the pool and nodeName of the ResourceSlice (required)", env="NODE_NAME"
    )
    dra_opt(
        "--kubeconfig", None, "kubeconfig of the API server (default: the in-cluster config of a pod)", env="KUBECONFIG"
    )
    dra_opt(
        "--kubelet-plugins-dir",
        DRA_DEFAULTS["kubelet_plugins_dir"],
        "parent of the driver's own dir holding dra.sock (default %(default)s)",
    )
    dra_opt(
        "--cdi-root",
        DRA_DEFAULTS["cdi_root"],
        "where the CDI spec of each prepared claim is written (default %(default)s)",
    )
    dra.add_argument(
        "--device-status",
        action="store_true",
        default=_env_bool("--device-status"),
        help="publish each prepared GPU's UUID, model and minor number in its entry of the claim's status.devices, "
        "keeping what others wrote there (needs patch on resourceclaims/status and, from 1.36, on "
        "resourceclaims/driver for the driver name) [DP_DEVICE_STATUS]",
    )
    return p


#: Defaults of the DRA flags: the Go kubeletplugin helper's standard paths and the DRA driver name.
DRA_DEFAULTS = {
    "driver_name": "gpu.devplug.io",
    "kubelet_registrar_dir": "/var/lib/kubelet/plugins_registry",
    "kubelet_plugins_dir": "/var/lib/kubelet/plugins",
    "cdi_root": "/var/run/cdi",
}
#: Values of ``--registration``.
REGISTRATIONS = ("kubelet.sock", "plugins_registry")
DEVICE_PLUGIN_ONLY = (
    "plugin_dir",
    "resource_name",
    "pre_start_required",
    "device_list_strategy",
    "cdi_spec_dir",
    "replicas",
    "socket_name",
    "second_resource",
    "registration",
)
DRA_ONLY = ("driver_name", "node_name", "kubeconfig", "kubelet_plugins_dir", "cdi_root", "device_status")
#: A DRA driver name: a DNS subdomain of at most 63 characters (the API's limit) starting with a letter
#: (CDI vendor rule).
_DRIVER_NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _check_mode(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Flags of the other mode given on the command line (their values differ from the defaults) are errors."""
    for dest in DRA_ONLY if not args.dra else DEVICE_PLUGIN_ONLY:
        if getattr(args, dest) != parser.get_default(dest):
            parser.error(
                f"{_flag(dest)} "
                f"{'needs --dra' if not args.dra else 'is a device-plugin flag; it does nothing with --dra'}"
            )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_mode(parser, args)
    raw_strategies = args.device_list_strategy or [os.environ.get("DP_DEVICE_LIST_STRATEGY", "envvar")]
    strategies = _split(raw_strategies)
    for s in strategies:
        if s not in STRATEGIES:
            parser.error(f"--device-list-strategy: unknown strategy {s!r} (choose from {', '.join(STRATEGIES)})")
    if not strategies:
        parser.error("--device-list-strategy: at least one strategy is needed")
    args.device_list_strategy = tuple(dict.fromkeys(strategies))
    # gRPC reads "unix:dir/x" as an authority and DeviceSpecs need absolute host paths.
    for attr in (
        "plugin_dir",
        "mock_state",
        "cdi_spec_dir",
        "driver_lib_dir",
        "dev_root",
        "kubelet_registrar_dir",
        "kubelet_plugins_dir",
        "cdi_root",
    ):
        if getattr(args, attr):
            setattr(args, attr, os.path.abspath(getattr(args, attr)))
    try:
        args.ignored_xids = tuple(int(x) for x in _split([args.ignored_xids]))
    except ValueError:
        parser.error(f"--ignored-xids: expected comma-separated integers, got {args.ignored_xids!r}")
    if args.nvml not in ("mock", "real"):
        parser.error(f"--nvml: must be mock or real, got {args.nvml!r}")
    if args.nvml == "mock" and not args.mock_state:
        parser.error("--nvml mock needs --mock-state FILE (or DP_MOCK_STATE)")
    name = args.resource_name
    if not _extended(name):
        parser.error(f"--resource-name: {name!r} is not an extended resource name like vendor.com/gpu")
    args.second_resource = _second_resource(parser, args.second_resource, name)
    args.socket_name = args.socket_name or None
    if args.socket_name is not None and ("/" in args.socket_name or args.socket_name == "kubelet.sock"):
        parser.error(f"--socket-name: {args.socket_name!r} must be a plain file name other than kubelet.sock")
    if args.socket_name is not None and args.second_resource is not None:
        parser.error("--socket-name names one socket; with --second-resource each resource has its own (leave it out)")
    try:
        args.replicas = int(args.replicas)
    except ValueError:
        parser.error(f"--replicas: expected a whole number, got {args.replicas!r}")
    if args.replicas < 1:
        parser.error(f"--replicas: must be at least 1, got {args.replicas}")
    if args.dra:
        if not args.node_name:
            parser.error("--dra needs this node's name: --node-name or NODE_NAME")
        name = args.driver_name
        if len(name) > 63 or not _DRIVER_NAME.fullmatch(name):
            parser.error(
                f"--driver-name: {name!r} is not a DRA driver name (a lower-case DNS subdomain of at most 63 "
                "characters starting with a letter, e.g. gpu.example.com)"
            )
    level = getattr(logging, str(args.log_level).upper(), None)
    if not isinstance(level, int):
        parser.error(f"--log-level: unknown level {args.log_level!r}")
    args.log_level = level
    return args


def _extended(name: str) -> bool:
    return "/" in name and not name.startswith("kubernetes.io/") and bool(name.split("/", 1)[1])


def _second_resource(parser: argparse.ArgumentParser, value: str | None, first: str) -> tuple[str, int] | None:
    """``--second-resource NAME=N`` as ``(NAME, N)``."""
    if value is None or not value.strip():
        return None
    name, sep, count = value.strip().rpartition("=")
    if not sep or not _extended(name) or not count.strip().isdigit() or int(count) < 1:
        parser.error(
            f"--second-resource: {value!r} is not NAME=N (an extended resource name like vendor.com/mig, N >= 1)"
        )
    if name == first:
        parser.error(f"--second-resource: {name!r} is already --resource-name")
    return name, int(count)


MOCK_STATE_ENV = "DEVPLUG_NVML_STATE"
"""Where the mock libnvidia-ml.so.1 finds its state file."""


def _load_nvml(lib_path: str | None) -> None:
    """``pynvml.nvmlInit()`` on ``lib_path``, or on the loader's libnvidia-ml.so.1 (``LD_LIBRARY_PATH``)."""
    import ctypes

    import pynvml

    if lib_path:
        try:
            lib = ctypes.CDLL(lib_path)
        except OSError as exc:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND) from exc
        with pynvml.libLoadLock:
            pynvml.nvmlLib = lib
            pynvml._nvmlGetFunctionPointer_cache.clear()
    pynvml.nvmlInit()


class _Runner(Protocol):
    """One mode's serving part: the device plugin or the DRA driver."""

    def on_change(self) -> None: ...

    def run(self) -> None: ...

    def request_stop(self) -> None: ...

    def stop(self) -> None: ...


class _DevicePlugin:
    """The device plugin's serving part: a socket and registration per resource (``--resource-name``, and
    ``--second-resource`` from the same process), and the files that mirror the device list."""

    def __init__(
        self, args: argparse.Namespace, state: DeviceState, faults: MockFaults | None, stopping: threading.Event
    ) -> None:
        self.args = args
        self.state = state
        self.stopping = stopping
        #: The GPUs of --second-resource, chosen at the first probe; every other GPU is --resource-name's.
        second = args.second_resource is not None
        self._second: set[str] | None = None if second else set()
        self.resources: list[tuple[str, Callable[[str], bool]]] = [(args.resource_name, self._first_owns)]
        if second:
            self.resources.append((args.second_resource[0], lambda uuid: not self._first_owns(uuid)))
        self.allocs = [
            AllocationConfig(
                resource_name=name,
                strategies=args.device_list_strategy,
                dev_root=args.dev_root,
                driver_lib_dir=args.driver_lib_dir,
                cdi_spec_dir=args.cdi_spec_dir,
                replicas=args.replicas,
            )
            for name, _ in self.resources
        ]
        self.servers: list[PluginServer | WatchedPluginServer] = []
        watched = args.registration == "plugins_registry"
        #: Where the sockets are: the plugin watcher's directory, or the device-plugin directory beside kubelet.sock.
        self.socket_dir = args.kubelet_registrar_dir if watched else args.plugin_dir
        for alloc, (name, member) in zip(self.allocs, self.resources, strict=True):
            servicer = DevicePluginServicer(
                state,
                alloc,
                args.pre_start_required,
                faults.allocate if faults else None,
                stopping,
                pre_start_fault=faults.pre_start if faults else None,
                member=member if second else None,
            )
            config = ServerConfig(
                self.socket_dir,
                name,
                args.socket_name or instance_socket_name(self.socket_dir, name),
                args.pre_start_required,
            )
            self.servers.append(
                WatchedPluginServer(config, servicer, stopping) if watched else PluginServer(config, servicer, stopping)
            )

    def _first_owns(self, uuid: str) -> bool:
        return self._second is None or uuid not in self._second

    def on_change(self) -> None:
        """Keep the files that mirror the device list (CDI spec, fake dev nodes) current. The first call (after
        the first probe) also chooses the second resource's GPUs."""
        if self._second is None:
            self._second = _split_gpus(self.state, *self.args.second_resource)
        gpus = self.state.snapshot().gpus
        try:
            if self.args.create_dev_nodes:
                ensure_dev_nodes(self.args.dev_root, [g.info.minor for g in gpus])
            for alloc, (_, member) in zip(self.allocs, self.resources, strict=True):
                if alloc.uses_cdi:
                    log.info("CDI spec written to %s", write_cdi_spec(alloc, [g for g in gpus if member(g.uuid)]))
        except OSError as exc:
            log.error("cannot update device files: %s", exc)

    def run(self) -> None:
        """Run every resource's server (one thread each) until all return; the first error stops the others."""
        os.makedirs(self.socket_dir, exist_ok=True)
        errors: list[BaseException] = []

        def run(server: PluginServer | WatchedPluginServer) -> None:
            try:
                server.run()
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread, which reports it
                errors.append(exc)
                self.request_stop()

        threads = [
            threading.Thread(target=run, args=(s,), name=f"serve-{s.config.resource_name}") for s in self.servers
        ]
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.5)  # in slices: the main thread must stay free for SIGTERM's handler
        if errors:
            raise errors[0]

    def request_stop(self) -> None:
        for server in self.servers:
            server.request_stop()
        self.stopping.set()

    def stop(self) -> None:
        self.stopping.set()
        for server in self.servers:
            server.stop()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    api = None
    if args.dra:  # before NVML: a driver that cannot reach the API server is a configuration error
        from .dra.kubeapi import ApiConfigError, connect

        try:
            api = connect(args.kubeconfig)
        except ApiConfigError as exc:
            print(f"{PROG}: error: {exc}", file=sys.stderr)
            return 2
    import pynvml

    faults: MockFaults | None = None
    if args.nvml == "mock":
        # The same NVML code as on a GPU node, on the mock library; it reads the state file named here.
        os.environ[MOCK_STATE_ENV] = args.mock_state
        faults = MockFaults(args.mock_state)
    try:
        _load_nvml(args.nvml_lib)
    except pynvml.NVMLError as exc:
        where = args.nvml_lib or "libnvidia-ml.so.1"
        if args.nvml == "mock":
            print(
                f"{PROG}: error: the mock NVML ({where}) did not start: {exc}; its reason about "
                f"{os.environ[MOCK_STATE_ENV]} is printed above (is the mock library on LD_LIBRARY_PATH?)",
                file=sys.stderr,
            )
            return 2
        print(
            f"{PROG}: error: cannot use NVML ({where}): {exc}. On a node without an NVIDIA driver "
            f"use --nvml mock with pytest-devplug's mock libnvidia-ml.so.1.",
            file=sys.stderr,
        )
        return 1
    log.info("NVML: driver %s", pynvml.nvmlSystemGetDriverVersion())

    stopping = threading.Event()
    state = DeviceState()
    monitor = HealthMonitor(state, args.ignored_xids)
    runner: _Runner
    if api is not None:
        from .dra.driver import Driver

        runner = Driver(args, api, state, faults.allocate if faults else None, stopping)
    else:
        runner = _DevicePlugin(args, state, faults, stopping)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("received %s: shutting down", signal.Signals(signum).name)
        runner.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    rc = 0
    try:
        monitor.start()
        runner.on_change()  # after the first probe, even when it found no GPU
        monitor.on_change = runner.on_change
        runner.run()
    except RegistrationRefused as exc:
        log.error("registration refused by the kubelet: %s", exc)
        print(f"{PROG}: error: registration refused by the kubelet: {exc}", file=sys.stderr)
        rc = 1
    except SecondResourceError as exc:
        print(f"{PROG}: error: --second-resource: {exc}", file=sys.stderr)
        rc = 2
    except Exception as exc:
        log.exception("fatal: %s", exc)
        rc = 1
    finally:
        runner.stop()
        # Exiting: do not sit out the health thread's event wait (up to a second); NVML is shut down
        # only when no thread is inside it, otherwise the process exit ends both.
        if monitor.stop(timeout=0.1):
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError:
                pass
    log.info("stopped (exit %d)", rc)
    return rc


class SecondResourceError(Exception):
    """``--second-resource`` asks for more GPUs than the node has beside the first resource's."""


def _split_gpus(state: DeviceState, name: str, count: int) -> set[str]:
    """The UUIDs of the ``count`` GPUs with the highest minor numbers, for the second resource."""
    gpus = state.snapshot().gpus  # ordered by minor number
    if count >= len(gpus):
        raise SecondResourceError(
            f"{name} asks for {count} GPUs, the node has {len(gpus)}: at least one must stay the first resource's"
        )
    chosen = {g.uuid for g in gpus[len(gpus) - count :]}
    log.info("second resource %s: GPUs %s", name, ",".join(sorted(chosen)))
    return chosen


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
