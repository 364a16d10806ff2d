"""Where a run's files live: short work dirs that record their owner, and a sweep of dirs whose run died.

Unix socket paths are limited to 107 bytes (``sun_path``), so a work dir goes under the temp dir only
when that leaves room for the sockets below it, else under ``/tmp``. Each dir records the pid and
start time of the process that made it; a run killed with SIGKILL cannot remove its dir, so the next
:func:`create` removes the dirs whose owner is *provably* gone (no such pid, or that pid now belongs to
a process started at another time), and kills what that run's plugins left running (their own children,
which the parent-death signal does not reach; they carry the owner in ``DEVPLUG_RUN_OWNER``). A dir of a live run,
of another user, or without a readable
owner record is never touched: other test runs may share this temp dir.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from pathlib import Path

from . import process
from ..errors import SocketPathTooLongError

__all__ = ["SUN_PATH_MAX", "check_socket_path", "base_dir", "create", "remove", "sweep"]

#: Longest Unix socket path Linux accepts (``sizeof(sun_path)`` minus the terminating NUL).
SUN_PATH_MAX = 107
PREFIX = "devplug-"
OWNER_FILE = ".devplug-owner"
#: Room kept for ``c/<node>/device-plugins/<socket name>`` below a work dir.
_SOCKET_RESERVE = 64


def check_socket_path(path: Path, what: str) -> None:
    """Raise a clear error, before gRPC fails with an unexplained one, when ``path`` is too long."""
    size = len(os.fsencode(str(path)))
    if size > SUN_PATH_MAX:
        raise SocketPathTooLongError(
            f"{what} socket path is {size} bytes, over the {SUN_PATH_MAX}-byte limit of Unix socket paths: {path} "
            "(use a shorter work dir; EmbeddedPlane() and the sim backend pick one themselves)"
        )


def base_dir() -> Path:
    """The temp dir, unless its path leaves too little room for the sockets below it; then ``/tmp``."""
    base = tempfile.gettempdir()
    if len(os.fsencode(base)) + _SOCKET_RESERVE <= SUN_PATH_MAX:
        return Path(base)
    return Path("/tmp")


def _owner_gone(record: str) -> bool:
    try:
        pid_text, start = record.split()
        pid = int(pid_text)
    except ValueError:
        return False  # unreadable: not provably dead
    if os.path.isdir("/proc/self"):
        now = process.start_time(pid)
        return now is None or now != start
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False  # that pid lives; without /proc we cannot tell whether it is the same process


def sweep(base: Path | None = None, prefix: str = PREFIX) -> list[Path]:
    """Remove this user's work dirs under ``base`` whose owner process is gone; returns them."""
    base = base_dir() if base is None else base
    removed = []
    try:
        candidates = list(base.glob(f"{prefix}*"))
    except OSError:
        return []
    for d in candidates:
        try:
            if d.is_symlink() or not d.is_dir() or d.stat().st_uid != os.geteuid():
                continue
            record = (d / OWNER_FILE).read_text()
        except OSError:
            continue
        if _owner_gone(record):
            _kill_strays(record.strip())
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


def _kill_strays(owner: str) -> None:
    """SIGKILL this user's processes started by the dead run ``owner``: a plugin's children that its
    parent-death signal did not reach. They carry ``DEVPLUG_RUN_OWNER=<owner>`` in their environment."""
    marker = f"\0{process.RUN_OWNER_ENV}={owner}\0".encode()
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if entry.stat().st_uid != os.geteuid() or marker not in b"\0" + (entry / "environ").read_bytes():
                continue
            os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, ValueError):
            continue  # gone meanwhile, or not ours to read


def create(prefix: str = PREFIX) -> Path:
    """A fresh work dir with a short path and an owner record, removed on SIGTERM/second SIGINT too;
    first sweeps the dirs that crashed runs left."""
    base = base_dir()
    sweep(base)
    d = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    (d / OWNER_FILE).write_text(process.run_owner() + "\n")
    process.remove_when_killed(d)
    return d


def remove(d: Path) -> None:
    """Remove a work dir made by :func:`create`."""
    shutil.rmtree(d, ignore_errors=True)
    process.forget(d)
