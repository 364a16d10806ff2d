"""A kubelet checkpoint file on the node: bounded reads and the checkpoint manager's atomic writes.

Upstream's ``pkg/kubelet/checkpointmanager`` beside the codecs: the device manager's format and its rules (Go's
``json.Unmarshal``, the checksum) are :mod:`pytest_devplug.kubeletmodel.checkpoint`, the DRA manager's
:mod:`pytest_devplug.kubeletmodel.dracheckpoint`; both read and write their files through this module. The only I/O
in the kubelet model, kept here so that the embedded kubelet and the real-cluster backends share it.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from pytest_devplug.kubeletmodel.checkpoint import CheckpointData, decode_verified, encode
from pytest_devplug.errors import CheckpointFormatError

__all__ = ["MAX_CHECKPOINT_BYTES", "read_bytes", "read_checkpoint", "write_checkpoint", "write_atomically"]

#: Read no more than this: a real checkpoint holds a few hundred bytes per container.
MAX_CHECKPOINT_BYTES = 16 * 1024 * 1024


def read_bytes(path: Path, limit: int = MAX_CHECKPOINT_BYTES) -> bytes:
    """The content of a regular file of at most ``limit`` bytes. A FIFO, a device such as
    ``/dev/zero`` or a directory is refused before anything is read, so nothing blocks or grows."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointFormatError(f"{path}: not a regular file ({_file_kind(st.st_mode)})")
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise CheckpointFormatError(f"{path}: larger than {limit} bytes; not a device-manager checkpoint")
        return b"".join(chunks)
    finally:
        os.close(fd)


def _file_kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return f"mode {stat.filemode(mode)}"


def read_checkpoint(path: Path) -> CheckpointData:
    """Read and verify a checkpoint; raises :class:`~pytest_devplug.errors.CheckpointCorruptError` on a checksum
    mismatch."""
    return decode_verified(read_bytes(path), source=str(path))


def write_checkpoint(path: Path, data: CheckpointData) -> None:
    """Write atomically as the kubelet does: temp file in the same dir, fsync, rename."""
    write_atomically(path, encode(data))


def write_atomically(path: Path, blob: bytes) -> None:
    """The kubelet's checkpoint manager's write: temp file in the same dir, fsync, rename (no partial file
    is ever seen, a failed write leaves no temp file)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
