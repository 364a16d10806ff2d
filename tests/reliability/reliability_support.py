"""Bounded fuzzing of the paths an adversary reaches: checkpoint reader and CLI, Registration,
pod admission. Each test runs a fixed number of generated cases (``DEVPLUG_FUZZ_SCALE`` multiplies
them; ``bench/bench_reliability.py`` runs many more), derandomized so a run is repeatable, with no
example database left in the working tree.

Shared by the test modules here (imported by name: a conftest.py would shadow those of other test
directories that are imported as ``conftest``): the hypothesis profile, the scale, and the Go
reference decoder (tests/reliability/gojson) with its fixture.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

HERE = Path(__file__).parent
SCALE = float(os.environ.get("DEVPLUG_FUZZ_SCALE", "1"))

#: Repeatable runs, no example database in the working tree, no per-example deadline on a loaded CI.
RELIABILITY = settings(
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)


def examples(n: int) -> int:
    """``n`` scaled by ``DEVPLUG_FUZZ_SCALE`` (at least 1)."""
    return max(1, int(n * SCALE))


def _cache_dir() -> Path:
    base = os.environ.get("DEVPLUG_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "pytest-devplug"
    )
    return Path(base)


def build_gojson() -> Path | str:
    """Build the Go reference decoder (cached by source hash); a reason string when Go is missing."""
    go = shutil.which("go")
    if go is None:
        return "Go is not installed: the differential check against encoding/json needs it"
    src = HERE / "gojson"
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(src.iterdir()) if p.is_file())).hexdigest()[:16]
    binary = _cache_dir() / "gojson" / digest / "gojson"
    if not binary.exists():
        binary.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local", "CGO_ENABLED": "0"}
        tmp = binary.with_name(f"gojson.{os.getpid()}")
        proc = subprocess.run(
            [go, "build", "-o", str(tmp), "."], cwd=src, env=env, capture_output=True, text=True, timeout=300
        )
        if proc.returncode != 0:
            return f"go build of tests/reliability/gojson failed: {proc.stderr.strip()}"
        os.replace(tmp, binary)
    return binary


class GoDecoder:
    """A running ``gojson`` reading length-prefixed inputs from stdin, one JSON line each back."""

    def __init__(self, binary: Path) -> None:
        self._proc = subprocess.Popen([str(binary)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def decode(self, blob: bytes) -> dict[str, object]:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(b"%d\n" % len(blob) + blob)
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"gojson exited ({self._proc.wait(5)})")
        result: dict[str, object] = json.loads(line)
        return result

    def decode_raw(self, blob: bytes) -> bytes | None:
        """Go's ``json.Marshal`` of what it decoded, byte for byte (``None`` if it refused)."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(b"%d\n" % len(blob) + blob)
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        prefix = b'{"file":"-","ok":true,"value":'
        if not line.startswith(prefix):
            return None
        return line[len(prefix) : -len(b"}\n")]

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()


@pytest.fixture(scope="session")
def go_decoder() -> Iterator[GoDecoder]:
    built = build_gojson()
    if isinstance(built, str):
        pytest.skip(built)
    dec = GoDecoder(built)
    yield dec
    dec.close()
