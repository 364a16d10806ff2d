"""Device-plugin subprocesses that never outlive the test session.

Each plugin runs in its own session and process group (so a kill reaches its children too) with stdout and
stderr appended to one log file. It is started through :mod:`~pytest_devplug.procs.launcher`, which arms a
parent-death signal (a test run killed with SIGKILL takes its plugins with it) and, for a plugin given
``binds``, makes the private mount namespace that shows it the node's directories at the kubelet's
standard paths. Every process is forked by one long-lived thread, because the parent-death signal fires
when the *thread* that forked the process ends.

Every live process sits in a module registry that is emptied by ``atexit`` and, once a process has
been started from the main thread, by SIGTERM/SIGINT handlers that kill the plugins and then defer to
the handler that was there before (a signal the process ignores stays ignored). Work dirs registered
with :func:`remove_when_killed` are removed when the signal ends the process (SIGTERM) and on a second
SIGINT, which exits at once rather than interrupt pytest's teardown half-way.
"""

from __future__ import annotations

import atexit
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from . import launcher
from .boot import NodeBoot
from pytest_devplug.errors import NamespaceUnavailableError, PluginProcessError

__all__ = [
    "PluginProcess",
    "RUN_OWNER_ENV",
    "append_log",
    "forget",
    "kill_all",
    "live_processes",
    "namespace_problem",
    "remove_when_killed",
    "run_owner",
    "start_time",
]

T = TypeVar("T")
_LAUNCHER = [sys.executable, "-I", "-S", launcher.__file__]

_registry: dict[int, PluginProcess] = {}
#: Reentrant: the signal handlers below run on the main thread, maybe while it holds the lock.
_registry_lock = threading.RLock()
_handlers_installed = False
_previous_handlers: dict[int, Any] = {}
_work_dirs: set[Path] = set()
_interrupted = False
#: Set when a signal or the interpreter's exit kills the plugins: from then on none starts (a supervisor's
#: immediate restart would otherwise run it again, and re-create its dirs after the work dir was removed).
_ending = threading.Event()


#: Set in every plugin's environment to :func:`run_owner` (inherited by its children), so the run that
#: follows a SIGKILLed one can find a plugin's own children that outlived it (``workdir.sweep``).
RUN_OWNER_ENV = "DEVPLUG_RUN_OWNER"


def start_time(pid: int) -> str | None:
    """A process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22), if visible."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def run_owner() -> str:
    """``"<pid> <start time>"`` of this process: who owns the run's work dirs and plugins."""
    me = os.getpid()
    return f"{me} {start_time(me) or 'unknown'}"


def live_processes() -> list[PluginProcess]:
    """Processes started here and not yet reaped (for evidence and leak checks)."""
    with _registry_lock:
        return list(_registry.values())


def kill_all() -> None:
    """SIGKILL every registered process group and reap it, and refuse later starts; safe to call more than once."""
    _ending.set()
    for proc in live_processes():
        proc._kill_group(signal.SIGKILL)
        proc.wait(timeout=5.0)


def remove_when_killed(path: Path) -> None:
    """Remove ``path`` (a run's work dir) if a signal ends the run before its own teardown does."""
    with _registry_lock:
        _work_dirs.add(Path(path))


def forget(path: Path) -> None:
    """``path`` was removed by its owner: nothing to do for it on a signal any more."""
    with _registry_lock:
        _work_dirs.discard(Path(path))


def _kill_everything() -> None:
    kill_all()
    # Under the lock that every write into a work dir takes (:func:`append_log`, :meth:`PluginProcess.start`):
    # a supervisor thread noting an exit cannot re-create a file in a dir half removed.
    with _registry_lock:
        for path in list(_work_dirs):
            shutil.rmtree(path, ignore_errors=True)


def append_log(path: Path, line: str) -> None:
    """Append ``line`` to a plugin's log, unless the run is ending (its work dirs are being removed)."""
    with _registry_lock:
        if _ending.is_set():
            return
        try:
            with open(path, "a") as log:
                log.write(line + "\n")
        except OSError:
            pass  # the work dir is going away


def _on_signal(signum: int, frame: FrameType | None) -> None:
    """Kill the plugins, then let the previous handler act (KeyboardInterrupt: pytest tears down).

    A second SIGINT while the first is being handled does not interrupt the teardown half-way (that
    could hang in a gRPC channel close): it kills the plugins, removes the work dirs and exits at once.
    A signal whose default action ends the process removes the work dirs before it does.
    """
    global _interrupted
    if signum == signal.SIGINT and _interrupted:
        _kill_everything()
        os.write(2, b"\ndevplug: interrupted again: plugins killed, work dirs removed, exiting now\n")
        os._exit(128 + signum)
    if signum == signal.SIGINT:
        _interrupted = True
    kill_all()
    previous = _previous_handlers.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        _kill_everything()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _install_handlers() -> None:
    """Install once, from the main thread; a signal the process ignores (SIG_IGN, e.g. SIGINT of a
    background job in a script) stays ignored."""
    global _handlers_installed
    if _handlers_installed or threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(sig)
        if previous == signal.SIG_IGN:
            continue
        _previous_handlers[sig] = previous
        signal.signal(sig, _on_signal)
    _handlers_installed = True


atexit.register(_kill_everything)


class _Forker:
    """One daemon thread that forks every plugin, so no plugin's parent thread ends before the run does."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], queue.SimpleQueue[tuple[bool, Any]]]] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def run(self, fn: Callable[[], T]) -> T:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="devplug-plugin-forker", daemon=True)
                self._thread.start()
        answer: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()
        self._jobs.put((fn, answer))
        ok, value = answer.get()
        if not ok:
            raise value
        return value  # type: ignore[no-any-return]

    def _loop(self) -> None:
        while True:
            fn, answer = self._jobs.get()
            try:
                answer.put((True, fn()))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                answer.put((False, exc))


_forker = _Forker()
_namespace_problem: list[str | None] = []


def namespace_problem() -> str | None:
    """Why a private mount namespace cannot be made here (``None``: it can); probed once per run."""
    if not _namespace_problem:
        try:
            done = subprocess.run([*_LAUNCHER, "--probe"], capture_output=True, text=True, timeout=30)
            problem = (
                None if done.returncode == 0 else (done.stderr.strip() or f"launcher probe exited {done.returncode}")
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            problem = f"devplug launcher probe failed: {exc}; {launcher.NO_NAMESPACE_HELP}"
        _namespace_problem.append(problem)
    return _namespace_problem[0]


class PluginProcess:
    """A plugin command line, run as given (placeholders are the harness's: ``PluginSpec.command``).

    ``binds`` (host directory, path the plugin sees) run it in a private mount namespace; see
    :mod:`~pytest_devplug.procs.launcher`. Starting raises :class:`NamespaceUnavailableError` when
    this machine allows no such namespace.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        binds: Sequence[tuple[Path, str]] = (),
        netdevs: Mapping[str, str] | None = None,
        boot: NodeBoot | None = None,
    ) -> None:
        self.argv = list(argv)
        #: The node's boot, shown to the process where a private namespace can be made (:mod:`.boot`).
        self.boot = boot
        #: Interface name -> MAC: taps in a network namespace of the plugin's own (a mock NIC node's netdevs).
        self.netdevs = dict(netdevs or {})
        self.log_path = Path(log_path)
        self.env = dict(env) if env is not None else None
        self.binds = [(Path(src), dst) for src, dst in binds]
        self._popen: subprocess.Popen[bytes] | None = None
        self._noted: subprocess.Popen[bytes] | None = None  # whose exit the log already records
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"PluginProcess(pid={self.pid}, running={self.running}, argv={self.argv!r})"

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen is not None else None

    @property
    def returncode(self) -> int | None:
        return self._poll()

    @property
    def running(self) -> bool:
        return self._popen is not None and self._poll() is None

    def _poll(self) -> int | None:
        popen = self._popen
        if popen is None:
            return None
        rc = popen.poll()
        if rc is not None:
            self._note_exit(popen, rc)
        return rc

    def _note_exit(self, popen: subprocess.Popen[bytes], rc: int) -> None:
        """Append the exit status to the log once, so the log says how the process ended."""
        if self._noted is popen:
            return
        self._noted = popen
        how = f"status {rc}" if rc >= 0 else f"killed by signal {-rc}"
        append_log(self.log_path, f"--- exited: {how}")

    def start(self) -> None:
        """Start the process (error if it is already running)."""
        # probed outside the locks: it may take seconds
        problem = namespace_problem() if self.binds or self.boot is not None else None
        # _registry_lock too: the dirs made here must not appear while a signal's handler removes the work dir.
        with self._lock, _registry_lock:
            if self.running:
                raise PluginProcessError(f"plugin already running (pid {self.pid}): {self.argv}")
            if _ending.is_set():
                raise PluginProcessError(f"not starting {self.argv}: the run is ending (its plugins were killed)")
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            env = {**os.environ, **(self.env or {}), RUN_OWNER_ENV: run_owner()}
            if not self.argv:
                raise PluginProcessError("cannot start plugin: empty command")
            if shutil.which(self.argv[0], path=env.get("PATH", os.defpath)) is None:
                raise PluginProcessError(
                    f"cannot start plugin {self.argv}: {self.argv[0]!r} is not an executable file or on PATH"
                )
            command = [*_LAUNCHER, "--parent", str(os.getpid())]
            if self.binds and problem is not None:
                raise NamespaceUnavailableError(problem)
            if self.boot is not None and problem is None:
                command += ["--boot-id", str(self.boot.id_file), "--boottime-origin", f"{self.boot.origin:.9f}"]
            if self.binds:
                scratch = self.log_path.with_name(f".{self.log_path.stem}.mnt")
                scratch.mkdir(exist_ok=True)
                command += ["--scratch", str(scratch)]
                for src, dst in self.binds:
                    if not src.exists():  # a node directory; a file bind (a stub device node) exists already
                        src.mkdir(parents=True)
                    command += ["--bind", str(src), dst]
            for name, mac in self.netdevs.items():
                command += ["--netdev", f"{name}={mac}"]
            with open(self.log_path, "ab") as log:
                where = "".join(f"; {dst} is {src}" for src, dst in self.binds if src.is_dir())
                log.write(f"--- start: {' '.join(self.argv)}{where}\n".encode())
                log.flush()

                def fork() -> subprocess.Popen[bytes]:
                    return subprocess.Popen(
                        [*command, "--", *self.argv],
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=env,
                        start_new_session=True,
                    )

                try:
                    popen = _forker.run(fork)
                except OSError as err:
                    raise PluginProcessError(f"cannot start plugin {self.argv}: {err}") from err
            self._popen = popen
            _install_handlers()
            _registry[popen.pid] = self
            if _ending.is_set():  # kill_all ran while this one was being forked: it missed it
                self._kill_group(signal.SIGKILL)
                raise PluginProcessError(f"not starting {self.argv}: the run is ending (its plugins were killed)")

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
        self._note_exit(popen, rc)
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
