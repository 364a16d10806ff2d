"""What a run leaves on a cluster, and who owns it: labels, the owner process, leftovers of dead runs, signals.

Everything a run creates lives in its namespace, labelled ``app.kubernetes.io/managed-by=pytest-devplug``
and annotated with the owner process (host, PID and the PID's start time, so a reused PID is not taken for
the owner). A run that ends normally, by Ctrl-C or by SIGTERM deletes its namespace (:class:`SignalGuard`
turns SIGTERM into the same ``KeyboardInterrupt`` pytest tears down after, and holds both signals off while
the teardown runs). A run that was SIGKILLed cannot: the next run on the same host deletes the namespaces
whose owner process is gone (:func:`sweep_orphans`). Runs of other hosts are left alone, their owner
cannot be checked from here.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from ...waiting import wait_for
from ...errors import BackendError, WaitTimeout
from .api import KubeApi

__all__ = ["MANAGED_BY", "Owner", "SignalGuard", "sweep_orphans", "delete_namespace"]

#: The label on everything a run creates (``app.kubernetes.io/managed-by``).
MANAGED_BY = ("app.kubernetes.io/managed-by", "pytest-devplug")
_HOST = "devplug.io/owner-host"
_PID = "devplug.io/owner-pid"
_START = "devplug.io/owner-start"


def _process_start(pid: int) -> str:
    """The PID's start time in clock ticks since boot (``/proc/PID/stat`` field 22); ``""`` where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except OSError:
        return ""
    # The command name (field 2) is in parentheses and may hold spaces: count fields after the last ")".
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else ""


@dataclass(frozen=True)
class Owner:
    """The process that owns a run's objects."""

    host: str
    pid: int
    start: str

    @classmethod
    def current(cls) -> Owner:
        pid = os.getpid()
        return cls(socket.gethostname(), pid, _process_start(pid))

    def annotations(self) -> dict[str, str]:
        return {_HOST: self.host, _PID: str(self.pid), _START: self.start}

    @classmethod
    def from_annotations(cls, annotations: dict[str, str]) -> Owner | None:
        try:
            return cls(annotations[_HOST], int(annotations[_PID]), annotations.get(_START, ""))
        except (KeyError, ValueError):
            return None

    def gone(self) -> bool | None:
        """Whether the owner process has exited: ``None`` when that cannot be told (another host)."""
        if self.host != socket.gethostname():
            return None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass  # another user's process: it exists
        return bool(self.start) and _process_start(self.pid) not in ("", self.start)


def delete_namespace(api: KubeApi, name: str, timeout: float) -> None:
    """Delete ``name`` and wait until it is gone (its pods stopped, so their devices are unregistered)."""
    api.delete_namespace(name)
    try:
        wait_for(
            lambda: api.namespace_exists(name),
            lambda exists: not exists,
            timeout=timeout,
            interval=1.0,
            what=f"namespace {name} deleted",
        )
    except WaitTimeout as exc:
        raise BackendError(f"{exc} (it is terminating; check it with kubectl get ns {name})") from None


def sweep_orphans(api: KubeApi, timeout: float) -> list[str]:
    """Delete the namespaces of earlier runs on this host whose owner process is gone; their names."""
    removed: list[str] = []
    try:
        namespaces = api.list_namespaces(label_selector=f"{MANAGED_BY[0]}={MANAGED_BY[1]}")
    except BackendError as exc:  # e.g. no RBAC to list namespaces: the run itself does not need it
        print(f"\ndevplug: cannot look for namespaces left by killed runs: {exc}", file=sys.stderr)
        return removed
    for ns in namespaces:
        meta = ns["metadata"]
        owner = Owner.from_annotations(meta.get("annotations") or {})
        if owner is None or not owner.gone() or meta.get("deletionTimestamp"):
            continue
        print(
            f"\ndevplug: removing namespace {meta['name']} left by run {owner.host} pid {owner.pid} "
            "(no longer running)",
            file=sys.stderr,
        )
        delete_namespace(api, str(meta["name"]), timeout)
        removed.append(str(meta["name"]))
    return removed


class SignalGuard:
    """SIGTERM ends the run as Ctrl-C does; during :meth:`shielded` (the teardown) both wait for it to finish.

    Only the main thread can set handlers; elsewhere (a run inside a thread) the guard does nothing.
    """

    def __init__(self) -> None:
        self._saved: dict[int, Any] = {}
        self._tearing_down = False

    def install(self) -> None:
        """A signal the process ignores (SIGINT of a background job in a script) stays ignored."""
        if threading.current_thread() is not threading.main_thread() or self._saved:
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            if signal.getsignal(sig) != signal.SIG_IGN:
                self._saved[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        """Put the previous handlers back, unless another one was installed over ours since (it chains to ours)."""
        for sig, handler in self._saved.items():
            if signal.getsignal(sig) == self._handle:
                signal.signal(sig, handler)
        self._saved.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._tearing_down:
            print(
                f"\ndevplug: {signal.Signals(signum).name} during cleanup of the cluster; it goes on (bounded waits). "
                "A SIGKILL leaves the run's namespace behind: the next run on this host removes it.",
                file=sys.stderr,
            )
            return
        raise KeyboardInterrupt(f"{signal.Signals(signum).name} received")

    @contextmanager
    def shielded(self) -> Iterator[None]:
        self._tearing_down = True
        try:
            yield
        finally:
            self._tearing_down = False
