"""Linux inotify through ctypes: the plugin's only way to notice file changes.

Used for the plugin directory (own socket deleted, ``kubelet.sock`` re-created) and for
the mock-state file (rewritten atomically by rename). Event driven, no polling, and no
dependency beyond libc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import select
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000

IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

_EVENT_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len


@dataclass(frozen=True)
class InotifyEvent:
    """One decoded ``struct inotify_event``; ``name`` is empty for events on the watched path itself."""

    wd: int
    mask: int
    cookie: int
    name: str


def _libc() -> ctypes.CDLL:
    name = ctypes.util.find_library("c") or "libc.so.6"
    lib = ctypes.CDLL(name, use_errno=True)
    lib.inotify_init1.argtypes = [ctypes.c_int]
    lib.inotify_init1.restype = ctypes.c_int
    lib.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    lib.inotify_add_watch.restype = ctypes.c_int
    lib.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.inotify_rm_watch.restype = ctypes.c_int
    return lib


def decode_events(buf: bytes) -> list[InotifyEvent]:
    """Split a ``read(2)`` buffer of an inotify fd into events (names are NUL padded)."""
    events: list[InotifyEvent] = []
    offset = 0
    while offset + _EVENT_HEADER.size <= len(buf):
        wd, mask, cookie, length = _EVENT_HEADER.unpack_from(buf, offset)
        offset += _EVENT_HEADER.size
        raw = buf[offset : offset + length]
        offset += length
        events.append(InotifyEvent(wd, mask, cookie, raw.split(b"\0", 1)[0].decode(errors="replace")))
    return events


class Inotify:
    """An inotify instance with a self-pipe so another thread can interrupt a blocking ``read``."""

    def __init__(self) -> None:
        self._lib = _libc()
        fd = self._lib.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_init1: {os.strerror(err)}")
        self.fd: int = fd
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._closed = False
        self._lock = threading.Lock()

    def add_watch(self, path: str, mask: int) -> int:
        """Watch ``path`` (usually a directory) for ``mask``; returns the watch descriptor."""
        wd = self._lib.inotify_add_watch(self.fd, os.fsencode(path), mask)
        if wd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_add_watch({path}): {os.strerror(err)}", path)
        return int(wd)

    def read(self, timeout: float | None) -> list[InotifyEvent]:
        """Block until events arrive, ``timeout`` seconds pass or :meth:`wake` is called."""
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        ms = None if timeout is None else max(0, int(timeout * 1000))
        try:
            ready = poller.poll(ms)
        except InterruptedError:  # pragma: no cover - PEP 475 retries; kept for safety
            return []
        events: list[InotifyEvent] = []
        for fd, _ in ready:
            if fd == self._wake_r:
                try:
                    os.read(self._wake_r, 4096)
                except BlockingIOError:
                    pass
            elif fd == self.fd:
                try:
                    events.extend(decode_events(os.read(self.fd, 65536)))
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                        raise
        return events

    def wake(self) -> None:
        """Make a blocked :meth:`read` return (thread safe)."""
        with self._lock:
            if not self._closed:
                try:
                    os.write(self._wake_w, b"x")
                except BlockingIOError:
                    pass

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for fd in (self.fd, self._wake_r, self._wake_w):
                os.close(fd)

    def __enter__(self) -> Inotify:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Follower:
    """Passes each batch of ``watcher``'s events to ``handle`` in a daemon thread until ``stopping`` is set and
    :meth:`stop` is called (which wakes the thread, waits for it and closes the watcher)."""

    def __init__(
        self, watcher: Inotify, stopping: threading.Event, handle: Callable[[list[InotifyEvent]], None], name: str
    ) -> None:
        self.watcher = watcher

        def loop() -> None:
            while not stopping.is_set():
                try:
                    events = watcher.read(None)
                except (OSError, ValueError):
                    return
                handle(events)

        self._thread = threading.Thread(target=loop, name=name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self.watcher.wake()
        self._thread.join(timeout)
        self.watcher.close()
