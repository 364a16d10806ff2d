"""Helpers for driving the GPU plugin as the kubelet would: a fake kubelet, the plugin as a
subprocess, and the mock-state file written atomically the way the harness writes it."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from pytest_devplug.api.deviceplugin import v1beta1_pb2 as pb
from pytest_devplug.api.deviceplugin import v1beta1_pb2_grpc as pb_grpc

from ..support import WAIT

RESOURCE = "example.com/gpu"
SOCKET = "devplug-example.com-gpu.sock"

# Lexical UUID order is the reverse of minor order, so "stable order" tests tell them apart.
UUIDS = [f"GPU-{9 - i}{i}000000-0000-4000-8000-00000000000{i}" for i in range(4)]


def make_gpus() -> list[dict[str, Any]]:
    """Four GPUs, two per NUMA node."""
    return [
        {
            "uuid": UUIDS[i],
            "name": "NVIDIA A100-SXM4-40GB",
            "memory_mib": 40960,
            "numa_node": i // 2,
            "minor": i,
            "lost": False,
            "fail_allocate": False,
        }
        for i in range(4)
    ]


class MockStateFile:
    """The mock-state JSON, always replaced atomically (temp file + rename), as the harness does."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.gpus = make_gpus()
        self.events: list[dict[str, Any]] = []
        self.write()

    def write(self) -> None:
        self.write_raw(json.dumps({"gpus": self.gpus, "events": self.events}))

    def write_raw(self, text: str) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.path)

    def gpu(self, uuid: str) -> dict[str, Any]:
        return next(g for g in self.gpus if g["uuid"] == uuid)

    def set(self, uuid: str, **fields: Any) -> None:
        self.gpu(uuid).update(fields)
        self.write()

    def xid(self, uuid: str, xid: int) -> None:
        self.events.append({"uuid": uuid, "xid": xid})
        self.write()


@dataclass
class Registration:
    """One Register call as the fake kubelet saw it, with the ListAndWatch stream it opened."""

    request: pb.RegisterRequest
    options: pb.DevicePluginOptions  # what GetDevicePluginOptions answered during Register
    received_at: float
    channel: grpc.Channel
    stub: pb_grpc.DevicePluginStub
    updates: queue.Queue[pb.ListAndWatchResponse] = field(default_factory=queue.Queue)
    last: pb.ListAndWatchResponse | None = None

    def next_update(self, timeout: float = WAIT) -> pb.ListAndWatchResponse:
        try:
            self.last = self.updates.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no ListAndWatch message within {timeout}s (last: {self.health()})") from None
        return self.last

    def wait_for(
        self, predicate: Callable[[dict[str, str]], bool], what: str, timeout: float = WAIT
    ) -> pb.ListAndWatchResponse:
        """Consume messages until ``predicate(health by ID)`` holds."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"ListAndWatch never showed {what} within {timeout}s; last: {self.health()}")
            try:
                self.last = self.updates.get(timeout=remaining)
            except queue.Empty:
                continue
            if predicate(self.health()):
                return self.last

    def health(self) -> dict[str, str]:
        return {d.ID: d.health for d in self.last.devices} if self.last is not None else {}

    def assert_no_update(self, within: float) -> None:
        try:
            msg = self.updates.get(timeout=within)
        except queue.Empty:
            return
        raise AssertionError(f"unexpected ListAndWatch message: {[(d.ID, d.health) for d in msg.devices]}")


class FakeKubelet(pb_grpc.RegistrationServicer):
    """Registration on kubelet.sock: validates like the kubelet, dials back, opens ListAndWatch."""

    def __init__(self, plugin_dir: Path, refuse: str | None = None, *, log_dir: Path | None = None) -> None:
        self.plugin_dir = plugin_dir
        self.log_dir = log_dir  # where the plugins' logs (plugin-*.log) are, for a failure's evidence
        self.refuse = refuse
        self.registrations: queue.Queue[Registration] = queue.Queue()
        self._all: list[Registration] = []
        #: Every Register answered with an error, as "resource: error" (the evidence when one never arrives).
        self.refused: list[str] = []
        #: Endpoints (socket names) a kubelet of 1.37+ still holds an endpoint on: a Register naming one is refused.
        self.held: set[str] = set()
        self._server: Any = None

    def Register(self, request: pb.RegisterRequest, context: Any) -> pb.Empty:
        if self.refuse:
            self._refuse(request, context, self.refuse)
        if request.version != "v1beta1":
            self._refuse(request, context, f'requested API version "{request.version}" is not supported')
        channel = grpc.insecure_channel(f"unix://{self.plugin_dir / request.endpoint}")
        stub = pb_grpc.DevicePluginStub(channel)
        try:
            # Like the kubelet (a 10 s dial): the endpoint must already answer while Register is in flight.
            options = stub.GetDevicePluginOptions(pb.Empty(), timeout=10)
        except grpc.RpcError as exc:
            channel.close()
            self._refuse(request, context, f"failed to dial device plugin: {exc.details()}")
        if request.endpoint in self.held:  # 1.37's PluginConnected, after asking the options
            channel.close()
            self._refuse(request, context, f"device plugin already connected: {self.plugin_dir / request.endpoint}")
        reg = Registration(request, options, time.monotonic(), channel, stub)
        stream = stub.ListAndWatch(pb.Empty())

        def pump() -> None:
            try:
                for msg in stream:
                    reg.updates.put(msg)
            except grpc.RpcError:
                pass

        threading.Thread(target=pump, daemon=True).start()
        self._all.append(reg)
        self.registrations.put(reg)
        return pb.Empty()

    def _refuse(self, request: pb.RegisterRequest, context: Any, message: str) -> None:
        self.refused.append(f"{request.resource_name}: {message}")
        context.abort(grpc.StatusCode.UNKNOWN, message)

    def start(self) -> FakeKubelet:
        server = grpc.server(__import__("concurrent.futures").futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_RegistrationServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.plugin_dir / 'kubelet.sock'}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(0).wait(2)
            self._server = None
        for reg in self._all:
            reg.channel.close()

    def next_registration(self, timeout: float = WAIT) -> Registration:
        """The next registration; on timeout, what was refused and the tail of every plugin log say why."""
        try:
            return self.registrations.get(timeout=timeout)
        except queue.Empty:
            logs = sorted(self.log_dir.glob("plugin-*.log")) if self.log_dir else []
            tails = "".join(
                f"\n--- {p.name} (last 30 lines) ---\n" + "\n".join(p.read_text(errors="replace").splitlines()[-30:])
                for p in logs
            )
            raise AssertionError(
                f"the plugin did not register within {timeout}s; {len(self._all)} registered before, "
                f"refused: {self.refused or 'none'}{tails}"
            ) from None


class PluginProcess:
    """``python -m devplug_gpu_plugin`` with its log in a file (no pipe to fill up)."""

    def __init__(self, args: list[str], log_path: Path, env: dict[str, str]) -> None:
        self.args = args
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "devplug_gpu_plugin", *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_log(self, text: str, timeout: float = WAIT, count: int = 1) -> str:
        """Bounded wait for ``text`` to appear ``count`` times in the log (the log is a file)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            content = self.log()
            if content.count(text) >= count:
                return content
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise AssertionError(f"log never showed {text!r} x{count} within {timeout}s:\n{self.log()}")

    def wait_exit(self, timeout: float = WAIT) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"plugin still running after {timeout}s:\n{self.log()}") from None

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def cleanup(self) -> None:
        """SIGTERM first, so the plugin removes its socket as in production; SIGKILL if it hangs."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGKILL)
                self.proc.wait(5)
        self._log.close()
