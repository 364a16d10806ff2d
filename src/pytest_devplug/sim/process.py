"""Device-plugin subprocesses that never outlive the test session.

Each plugin runs in its own session and process group (so a kill reaches its children too) with stdout and
stderr appended to one log file. Every live process sits in a module registry that is emptied
by ``atexit`` and, once a process has been started from the main thread, by SIGTERM/SIGINT
handlers that kill the plugins and then defer to the handler that was there before.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from pytest_devplug.sim.errors import PluginProcessError

__all__ = ["PluginProcess", "live_processes", "kill_all"]

_registry: dict[int, PluginProcess] = {}
_registry_lock = threading.Lock()
_handlers_installed = False
_previous_handlers: dict[int, Any] = {}


def live_processes() -> list[PluginProcess]:
    """Processes started here and not yet reaped (for evidence and leak checks)."""
    with _registry_lock:
        return list(_registry.values())


def kill_all() -> None:
    """SIGKILL every registered process group and reap it; safe to call more than once."""
    for proc in live_processes():
        proc._kill_group(signal.SIGKILL)
        proc.wait(timeout=5.0)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    kill_all()
    previous = _previous_handlers.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _install_handlers() -> None:
    global _handlers_installed
    if _handlers_installed or threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGINT):
        _previous_handlers[sig] = signal.getsignal(sig)
        signal.signal(sig, _on_signal)
    _handlers_installed = True


atexit.register(kill_all)


class PluginProcess:
    """A plugin command line; ``{plugin_dir}`` in ``argv`` is replaced by ``plugin_dir``."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        plugin_dir: Path,
        log_path: Path,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.plugin_dir = Path(plugin_dir)
        self.argv = [a.replace("{plugin_dir}", str(self.plugin_dir)) for a in argv]
        self.log_path = Path(log_path)
        self.env = dict(env) if env is not None else None
        self._popen: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"PluginProcess(pid={self.pid}, running={self.running}, argv={self.argv!r})"

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen is not None else None

    @property
    def returncode(self) -> int | None:
        return self._popen.poll() if self._popen is not None else None

    @property
    def running(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def start(self) -> None:
        """Start the process (error if it is already running)."""
        with self._lock:
            if self.running:
                raise PluginProcessError(f"plugin already running (pid {self.pid}): {self.argv}")
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            env = None
            if self.env is not None:
                env = {**os.environ, **self.env}
            with open(self.log_path, "ab") as log:
                log.write(f"--- start: {' '.join(self.argv)}\n".encode())
                log.flush()
                try:
                    popen = subprocess.Popen(
                        self.argv,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=env,
                        start_new_session=True,
                    )
                except OSError as err:
                    raise PluginProcessError(f"cannot start plugin {self.argv}: {err}") from err
            self._popen = popen
            _install_handlers()
            with _registry_lock:
                _registry[popen.pid] = self

    def _kill_group(self, sig: int) -> None:
        popen = self._popen
        if popen is None or popen.poll() is not None:
            return
        try:
            os.killpg(popen.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the plugin's process group (SIGKILL: a crash, SIGTERM: a stop)."""
        self._kill_group(sig)

    def wait(self, timeout: float | None = None) -> int | None:
        """Exit status, or ``None`` if still running after ``timeout`` seconds."""
        popen = self._popen
        if popen is None:
            return None
        try:
            rc = popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        with _registry_lock:
            if _registry.get(popen.pid) is self:
                del _registry[popen.pid]
        return rc

    def stop(self, timeout: float = 5.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``; returns the exit status."""
        if self._popen is None:
            return None
        self._kill_group(signal.SIGTERM)
        rc = self.wait(timeout)
        if rc is None:
            self._kill_group(signal.SIGKILL)
            rc = self.wait(timeout)
        if rc is None:
            raise PluginProcessError(f"plugin pid {self.pid} survived SIGKILL for {timeout} s")
        # Reap strays left in the group by a plugin that exited before its children.
        try:
            os.killpg(self._popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        return rc

    def restart(self, timeout: float = 5.0) -> None:
        self.stop(timeout)
        self.start()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
