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

    def emit(self, record: logging.LogRecord) -> None:
        line = self.format(record)
        with self.lock or threading.Lock():
            self.lines.append(line)
            if len(self.lines) > self.max_lines:
                del self.lines[: len(self.lines) - self.max_lines]
            try:
                with open(self.path, "a", encoding="utf-8") as fh:
                    fh.write(line + "\n")
            except OSError:
                pass  # the node dir is being removed: keep the in-memory copy

    def text(self) -> str:
        """The lines kept, as the log file reads."""
        with self.lock or threading.Lock():
            return "\n".join(self.lines) + ("\n" if self.lines else "")
