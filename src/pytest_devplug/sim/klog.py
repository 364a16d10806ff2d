"""The embedded kubelet's log in klog's format, kept in memory (bounded) and in the node's ``kubelet.log``."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

__all__ = ["KlogFormatter", "KlogHandler"]


class KlogFormatter(logging.Formatter):
    """klog's header: ``I0102 15:04:05.000000 12345 file.go:123] msg``."""

    def format(self, record: logging.LogRecord) -> str:
        lvl = {"DEBUG": "I", "INFO": "I", "WARNING": "W", "ERROR": "E", "CRITICAL": "F"}.get(record.levelname, "I")
        t = time.localtime(record.created)
        micros = int((record.created % 1) * 1_000_000)
        stamp = time.strftime("%m%d %H:%M:%S", t)
        return f"{lvl}{stamp}.{micros:06d} {os.getpid():>7} {record.module}.py:{record.lineno}] {record.getMessage()}"


class KlogHandler(logging.Handler):
    """Keeps the node's kubelet log in memory (the last ``max_lines``) and appends it to ``path``."""

    def __init__(self, path: Path, max_lines: int = 20000) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.max_lines = max_lines
        self.path = path
        self.setFormatter(KlogFormatter())
        try:
            path.touch()  # created once here; emit only appends, so a log removed with its node dir stays removed
        except OSError:
            pass  # no node dir (yet): the in-memory copy still works

    def emit(self, record: logging.LogRecord) -> None:
        line = self.format(record)
        with self.lock or threading.Lock():
            self.lines.append(line)
            if len(self.lines) > self.max_lines:
                del self.lines[: len(self.lines) - self.max_lines]
            try:
                # No O_CREAT: a line logged while the node dir is being removed must not re-create the file there
                # (rmtree had deleted it, then could not remove the directory: a run's temp dir left behind).
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
            except OSError:
                return  # the node dir is gone or going: keep the in-memory copy
            with os.fdopen(fd, "a", encoding="utf-8") as fh:
                fh.write(line + "\n")

    def text(self) -> str:
        """The lines kept, as the log file reads."""
        with self.lock or threading.Lock():
            return "\n".join(self.lines) + ("\n" if self.lines else "")
