"""The driver's two sockets, served until stop: ``dra.sock`` first (the kubelet dials it during
registration), then the registration socket the kubelet's plugin watcher finds.

A stale socket file is replaced at start; each socket is proved to answer before the next step. A socket
file that vanishes (someone cleaned the directory) is served again at once (inotify, and a check every
second should an event be missed): a new registration socket makes the plugin watcher register the driver
again, and the kubelet's channel to ``dra.sock`` reconnects by itself. The Go helper (v0.34) does not do
this; it keeps serving on the orphaned socket and the driver stays unreachable until it restarts. On
stop both files are removed, as the Go helper does.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from ..server import serve_unix
from ..watch import IN_DELETE, IN_MOVED_FROM, Follower, Inotify, InotifyEvent

__all__ = ["DriverServer", "Socket"]

log = logging.getLogger("devplug_gpu_plugin.dra.server")

PROVE_TIMEOUT_S = 5.0


@dataclass
class Socket:
    """One served socket: its path and how to put its services on a gRPC server."""

    path: str
    what: str
    add_services: Callable[[Any], None]
    server: Any = None

    def serve(self) -> None:
        self.stop()
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self.server = serve_unix(self.path, self.add_services, workers=8)
        with grpc.insecure_channel("unix://" + self.path) as channel:
            grpc.channel_ready_future(channel).result(timeout=PROVE_TIMEOUT_S)
        log.info("serving %s on %s", self.what, self.path)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(0).wait(2)
            self.server = None

    def remove(self) -> None:
        self.stop()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class DriverServer:
    """Serves ``sockets`` in order and keeps them served until :meth:`request_stop`."""

    def __init__(self, sockets: list[Socket], stopping: threading.Event) -> None:
        self.sockets = sockets
        self.stopping = stopping
        self._kick = threading.Event()
        self._follower: Follower | None = None

    def _start_watching(self) -> None:
        watcher = Inotify()
        names: dict[str, set[str]] = {}
        for s in self.sockets:
            names.setdefault(os.path.dirname(s.path), set()).add(os.path.basename(s.path))
        for directory in names:
            os.makedirs(directory, exist_ok=True)
            watcher.add_watch(directory, IN_DELETE | IN_MOVED_FROM)
        ours = set().union(*names.values())

        def handle(events: list[InotifyEvent]) -> None:
            if any(e.name in ours for e in events):
                self._kick.set()

        self._follower = Follower(watcher, self.stopping, handle, "socket-watch")

    def run(self) -> None:
        """Serve, then re-serve vanished sockets until stopped."""
        self._start_watching()
        for s in self.sockets:
            s.serve()
        while not self.stopping.is_set():
            self._kick.wait(1.0)
            self._kick.clear()
            if self.stopping.is_set():
                break
            for s in self.sockets:
                if not os.path.exists(s.path):
                    started = time.monotonic()
                    log.info("%s socket %s is gone: serving it again", s.what, s.path)
                    s.serve()
                    log.info("%s served again in %.3fs", s.what, time.monotonic() - started)

    def request_stop(self) -> None:
        """Ask :meth:`run` to return soon; safe from a signal handler (only sets events)."""
        self.stopping.set()
        self._kick.set()

    def stop(self) -> None:
        """Stop serving and remove the sockets (registration first: the kubelet stops using the driver)."""
        self.request_stop()
        for s in reversed(self.sockets):
            s.remove()
        if self._follower is not None:
            self._follower.stop()
            self._follower = None
