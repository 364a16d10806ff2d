"""Builds the mock ``libnvidia-ml.so.1`` from ``mock_nvml.c`` with the system C compiler, once, cached.

The cache key is a hash of the source and the flags, so an upgrade of pytest-devplug builds anew and
concurrent first uses (xdist workers, two sessions) build it once: the build runs under a file lock and
lands by rename.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ..errors import CompilerNotFoundError, MockBuildError

__all__ = [
    "CFLAGS",
    "LIB_NAME",
    "SOURCE",
    "STATE_ENV",
    "cache_root",
    "find_compiler",
    "mock_library",
]

SOURCE = Path(__file__).with_name("mock_nvml.c")
LIB_NAME = "libnvidia-ml.so.1"
STATE_ENV = "DEVPLUG_NVML_STATE"
"""The environment variable naming the mock-state file the library reads."""
CFLAGS = ("-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-fvisibility=hidden", "-pthread")
COMPILERS = ("cc", "gcc", "clang")


def cache_root() -> Path:
    """``${DEVPLUG_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pytest-devplug}``."""
    explicit = os.environ.get("DEVPLUG_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "pytest-devplug"


def find_compiler() -> list[str]:
    """``$CC`` when set, else the first of cc, gcc, clang on ``PATH``."""
    cc = os.environ.get("CC", "").strip()
    candidates = [shlex.split(cc)] if cc else [[name] for name in COMPILERS]
    for argv in candidates:
        found = shutil.which(argv[0])
        if found:
            return [found, *argv[1:]]
    tried = f"$CC={cc!r}" if cc else ", ".join(COMPILERS)
    raise CompilerNotFoundError(
        f"no C compiler found (tried {tried} on PATH): the mock libnvidia-ml.so.1 is compiled from "
        f"{SOURCE.name} at first use. Install one (e.g. `apt-get install gcc`) or point $CC at it."
    )


def _key(flags: Sequence[str]) -> str:
    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update("\0".join(flags).encode())
    return digest.hexdigest()[:16]


def mock_library(extra_flags: Sequence[str] = ()) -> Path:
    """The path of the built library (``<cache>/nvml/<hash>/libnvidia-ml.so.1``), building it if needed.

    ``extra_flags`` (e.g. sanitizers) make a separate cache entry. Raises :class:`CompilerNotFoundError`
    or :class:`MockBuildError`.
    """
    flags = (*CFLAGS, *extra_flags)
    out_dir = cache_root() / "nvml" / _key(flags)
    lib = out_dir / LIB_NAME
    if lib.is_file():
        return lib
    compiler = find_compiler()
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if lib.is_file():  # built by another process while this one waited
            return lib
        fd, tmp = tempfile.mkstemp(prefix=".build-", dir=out_dir)
        os.close(fd)
        try:
            proc = subprocess.run(
                [*compiler, *flags, "-o", tmp, str(SOURCE)], capture_output=True, text=True, timeout=300
            )
            if proc.returncode != 0:
                raise MockBuildError(
                    f"building the mock {LIB_NAME} failed ({' '.join(compiler)} exit {proc.returncode}):\n"
                    f"{proc.stderr.strip() or proc.stdout.strip()}"
                )
            os.replace(tmp, lib)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return lib
