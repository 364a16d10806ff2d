"""Helpers for the mock libnvidia-ml tests."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


class StateFile:
    """A mock-state file the test rewrites atomically, as the harness does."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, doc: Any) -> None:
        text = doc if isinstance(doc, (str, bytes)) else json.dumps(doc)
        data = text.encode() if isinstance(text, str) else text
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, self.path)
