"""``fail_allocate`` and ``fail_pre_start`` from the mock-state file: the mock faults with no NVML meaning.

Everything NVML reports in mock mode comes from the mock ``libnvidia-ml.so.1`` (which reads the same
file); only "make Allocate fail for this GPU" and "make PreStartContainer fail for this GPU" are the
plugin's own business, so it reads those flags here. The file is re-read when it changed (inode, mtime,
size); a file that cannot be read or parsed keeps the last good answer and is logged once, never raised
into an RPC.
"""

from __future__ import annotations

import json
import logging
import os
import threading

log = logging.getLogger("devplug_gpu_plugin.mock_faults")

#: The per-GPU flags read here, each failing one RPC.
FLAGS = ("fail_allocate", "fail_pre_start")


class MockFaults:
    """The flags of the mock state: ``allocate(uuid)`` and ``pre_start(uuid)`` answer a reason or ``None``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._key: tuple[int, int, int] | None = None
        self._set: dict[str, frozenset[str]] = {flag: frozenset() for flag in FLAGS}
        self._last_error = ""

    def allocate(self, uuid: str) -> str | None:
        """Why ``Allocate`` must fail for ``uuid`` (``fail_allocate``), or ``None``."""
        return self._why("fail_allocate", uuid)

    def pre_start(self, uuid: str) -> str | None:
        """Why ``PreStartContainer`` must fail for ``uuid`` (``fail_pre_start``), or ``None``."""
        return self._why("fail_pre_start", uuid)

    def _why(self, flag: str, uuid: str) -> str | None:
        if uuid in self._current()[flag]:
            return f"{flag} is set for {uuid} in mock state {self.path}"
        return None

    def _current(self) -> dict[str, frozenset[str]]:
        with self._lock:
            try:
                st = os.stat(self.path)
                key = (st.st_ino, st.st_mtime_ns, st.st_size)
                if key != self._key:
                    with open(self.path, "rb") as fh:
                        self._set = _flagged(fh.read())
                    self._key, self._last_error = key, ""
            except (OSError, ValueError, RecursionError) as exc:
                problem = f"mock state {self.path}: {exc}; keeping the last {'/'.join(FLAGS)} flags"
                if problem != self._last_error:
                    log.error("%s", problem)
                    self._last_error = problem
            return self._set


def _flagged(raw: bytes) -> dict[str, frozenset[str]]:
    """Flag -> UUIDs with it ``true`` (strict UTF-8 JSON; entries of other shapes are ignored)."""
    doc = json.loads(raw.decode("utf-8"))
    gpus = doc.get("gpus") if isinstance(doc, dict) else None
    if not isinstance(gpus, list):
        raise ValueError("'gpus' must be a list")
    ok = [g for g in gpus if isinstance(g, dict) and isinstance(g.get("uuid"), str)]
    return {flag: frozenset(g["uuid"] for g in ok if g.get(flag) is True) for flag in FLAGS}
