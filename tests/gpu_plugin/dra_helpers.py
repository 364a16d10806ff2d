"""Helpers for the GPU plugin as a DRA driver: its command line, the kubelet's side built from the harness's
DRA building blocks (``pytest_devplug.sim.dra``), and a reader of its health stream."""

from __future__ import annotations

import queue
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
from pytest_devplug.api.drahealth import v1alpha1_pb2 as hpb
from pytest_devplug.api.drahealth import v1alpha1_pb2_grpc as hpb_grpc
from pytest_devplug.sim.dra.health import HealthInfoCache
from pytest_devplug.sim.dra.plugins import DRAPluginManager, ResourceSliceWiper
from pytest_devplug.sim.pluginwatcher import DRA_PLUGIN_TYPE, PluginWatcher

from ..support import WAIT

DRIVER = "gpu.devplug.io"
NODE = "node-1"
#: A kubeconfig whose server refuses connections: the driver starts and registers without the API.
UNREACHABLE_KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: none, user: {token: none}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
"""


@dataclass(frozen=True)
class DriverDirs:
    """The kubelet's directories of one test node, under a short root (Unix socket paths stay under 108 bytes)."""

    root: Path

    @property
    def registrar(self) -> Path:
        return self.root / "plugins_registry"

    @property
    def plugins(self) -> Path:
        return self.root / "plugins"

    @property
    def cdi(self) -> Path:
        return self.root / "cdi"

    @property
    def reg_socket(self) -> Path:
        return self.registrar / f"{DRIVER}-reg.sock"

    @property
    def dra_socket(self) -> Path:
        return self.plugins / DRIVER / "dra.sock"

    def args(self, kubeconfig: Path) -> list[str]:
        return [
            "--dra",
            "--node-name",
            NODE,
            "--kubeconfig",
            str(kubeconfig),
            "--kubelet-registrar-dir",
            str(self.registrar),
            "--kubelet-plugins-dir",
            str(self.plugins),
            "--cdi-root",
            str(self.cdi),
            "--log-level",
            "debug",
        ]


@contextmanager
def driver_dirs() -> Iterator[DriverDirs]:
    root = Path(tempfile.mkdtemp(prefix="dra-drv-", dir="/tmp"))
    try:
        yield DriverDirs(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


class KubeletSide:
    """The kubelet's plugin watcher and DRA plugin manager (with the health cache) on ``dirs``."""

    def __init__(
        self, dirs: DriverDirs, wiper: ResourceSliceWiper | None = None, *, wiping_delay: float = 30.0
    ) -> None:
        self.health = HealthInfoCache()
        self.plugins = DRAPluginManager(
            NODE, wiper=wiper, wiping_delay=wiping_delay, health_cache=self.health, health_retry_period=0.5
        )
        self.watcher = PluginWatcher(dirs.registrar, {DRA_PLUGIN_TYPE: self.plugins}, poll_interval=0.02)
        self.watcher.start()

    def wait_usable(self, alive: Callable[[], str | None] = lambda: None) -> None:
        """Registered and its DRA socket connected; ``alive`` names why waiting is pointless (the driver exited)."""
        __tracebackhide__ = True
        from pytest_devplug.waiting import wait_for

        wait_for(
            lambda: self.plugins.usable(DRIVER),
            bool,
            timeout=WAIT,
            what=f"{DRIVER} registered and connected",
            give_up=alive,
        )

    def stop(self) -> None:
        self.watcher.stop()
        self.plugins.stop()


class HealthReader:
    """``NodeWatchResources`` of the driver's DRA socket, read in a thread into a queue."""

    def __init__(self, socket: Path) -> None:
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        self.messages: queue.Queue[hpb.NodeWatchResourcesResponse] = queue.Queue()
        self.last: hpb.NodeWatchResourcesResponse | None = None
        self._call = hpb_grpc.DRAResourceHealthStub(self.channel).NodeWatchResources(hpb.NodeWatchResourcesRequest())
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        try:
            for msg in self._call:
                self.messages.put(msg)
        except grpc.RpcError:
            pass

    def health(self) -> dict[str, tuple[str, str]]:
        """device name -> (HEALTHY/UNHEALTHY, message) in the last message read."""
        if self.last is None:
            return {}
        return {d.device.device_name: (hpb.HealthStatus.Name(d.health), d.message) for d in self.last.devices}

    def wait_for(
        self, predicate: Callable[[dict[str, tuple[str, str]]], bool], what: str
    ) -> dict[str, tuple[str, str]]:
        """Read messages until ``predicate(health())`` holds."""
        __tracebackhide__ = True
        deadline = time.monotonic() + WAIT
        while not (self.last is not None and predicate(self.health())):
            try:
                self.last = self.messages.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"the health stream never showed {what} within {WAIT}s; last: {self.health()}"
                ) from None
        return self.health()

    def close(self) -> None:
        self._call.cancel()
        self.channel.close()
