"""``fail_allocate`` from the mock-state file: the one mock fault with no NVML meaning.

Everything NVML reports in mock mode comes from the mock ``libnvidia-ml.so.1`` (which reads the same
file); only "make Allocate fail for this GPU" is the plugin's own business, so it reads that flag here.
The file is re-read when it changed (inode, mtime, size); a file that cannot be read or parsed keeps
the last good answer and is logged once, never raised into an ``Allocate``.
"""

from __future__ import annotations

import json
import logging
import os
import threading

log = logging.getLogger("devplug_gpu_plugin.mock_faults")


class AllocateFaults:
    """Callable ``uuid -> reason or None`` for the servicer's ``Allocate``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._key: tuple[int, int, int] | None = None
        self._failing: frozenset[str] = frozenset()
        self._last_error = ""

    def __call__(self, uuid: str) -> str | None:
        if uuid in self._current():
            return f"fail_allocate is set for {uuid} in mock state {self.path}"
        return None

    def _current(self) -> frozenset[str]:
        with self._lock:
            try:
                st = os.stat(self.path)
                key = (st.st_ino, st.st_mtime_ns, st.st_size)
                if key != self._key:
                    with open(self.path, "rb") as fh:
                        self._failing = _failing(fh.read())
                    self._key, self._last_error = key, ""
            except (OSError, ValueError, RecursionError) as exc:
                problem = f"mock state {self.path}: {exc}; keeping the last fail_allocate flags"
                if problem != self._last_error:
                    log.error("%s", problem)
                    self._last_error = problem
            return self._failing


def _failing(raw: bytes) -> frozenset[str]:
    """UUIDs with ``"fail_allocate": true`` (strict UTF-8 JSON; entries of other shapes are ignored)."""
    doc = json.loads(raw.decode("utf-8"))
    gpus = doc.get("gpus") if isinstance(doc, dict) else None
    if not isinstance(gpus, list):
        raise ValueError("'gpus' must be a list")
    return frozenset(
        g["uuid"] for g in gpus if isinstance(g, dict) and isinstance(g.get("uuid"), str) and g.get("fail_allocate") is True
    )
