"""Running the host tools the kind backend needs (``kind``, ``docker``) with bounded time and readable errors."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence

from ...errors import BackendUnavailableError, ToolError

__all__ = ["run", "run_bytes", "require_tool"]


def require_tool(name: str, hint: str) -> str:
    """The path of ``name`` on PATH, or :class:`BackendUnavailableError` saying how to get it."""
    path = shutil.which(name)
    if path is None:
        raise BackendUnavailableError(f"the kind backend needs `{name}` on PATH: {hint}")
    return path


def _describe(cmd: Sequence[str], rc: int | str, out: str, err: str) -> str:
    return f"`{' '.join(cmd)}` {rc}\n--- stdout (tail)\n{out[-3000:]}\n--- stderr (tail)\n{err[-3000:]}"


def run(
    cmd: Sequence[str],
    *,
    input: str | None = None,
    timeout: float = 120.0,
    check: bool = True,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` (text I/O; ``env``: its environment, default this process's); raises :class:`ToolError` on a
    non-zero exit (``check``) or on timeout."""
    try:
        proc = subprocess.run(
            list(cmd),
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=dict(os.environ if env is None else env),
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        raise ToolError(_describe(cmd, f"did not finish within {timeout:g}s", out, err)) from None
    except FileNotFoundError as exc:
        raise BackendUnavailableError(f"cannot run `{cmd[0]}`: {exc}") from None
    if check and proc.returncode != 0:
        raise ToolError(_describe(cmd, f"exited {proc.returncode}", proc.stdout, proc.stderr))
    return proc


def run_bytes(cmd: Sequence[str], *, input: bytes | None = None, timeout: float = 60.0) -> tuple[int, bytes, str]:
    """Run ``cmd`` with binary stdout (e.g. ``cat`` of the checkpoint); returns (rc, stdout, stderr)."""
    try:
        proc = subprocess.run(list(cmd), input=input, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ToolError(f"`{' '.join(cmd)}` did not finish within {timeout:g}s") from None
    return proc.returncode, proc.stdout, proc.stderr.decode(errors="replace")
