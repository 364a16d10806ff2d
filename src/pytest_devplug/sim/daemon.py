"""A plugin process kept running the way the kubelet keeps a DaemonSet pod's container running.

A device plugin ships as a DaemonSet: its container has ``restartPolicy: Always``, so a plugin that exits by
itself (it crashed, or it gave up after a failed ``Register`` and counts on being restarted) is started again
by the kubelet, with the kubelet's crash back-off (``pkg/kubelet/kuberuntime`` ``doBackOff`` over client-go's
``flowcontrol.Backoff``, as ``kubelet.go`` configures it):

* the back-off is keyed by the container and kept in the kubelet's memory: a kubelet that starts again has
  none, and while the kubelet is down nothing is restarted;
* an exited container whose key has no entry is restarted at once (``Next`` then makes the entry: 10 s);
* one that exited less than the entry's back-off ago waits (``CrashLoopBackOff``); once that much time has
  passed since it finished it is restarted and the back-off doubles, up to 300 s;
* a container that ran for more than 600 s from its last restart to its exit starts the sequence over
  (``HasExpiredFunc``).

The harness's own stop and kill are not exits of this kind: they stand for the pod being deleted, and the
plugin stays down until :meth:`PluginDaemon.start`, which starts it as a new pod (restart count 0, no
back-off). The kubelet notices an exit by polling (upstream's PLEG relists every second; here every
``relist`` seconds).

Neither start comes within ``spacing`` (:data:`~pytest_devplug.kubeletmodel.periods.PLEG_RELIST_PERIOD_S`, one
second) of the process's previous start: the harness can start a process again at once, a node cannot (its
restart waits for a relist, a replacement pod for the controllers and a sandbox). A plugin that names its socket
after the second it started in (squat's generic-device-plugin) would otherwise find its predecessor's stale socket
under its own name, a collision no node produces.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import SimError
from ..kubeletmodel.periods import PLEG_RELIST_PERIOD_S
from ..procs.process import PluginProcess, append_log

__all__ = ["BackOffPolicy", "CrashBackOff", "KUBELET_BACKOFF", "PluginDaemon"]


@dataclass(frozen=True)
class BackOffPolicy:
    """The kubelet's container restart back-off (``containerBackOffPeriod``, ``MaxContainerBackOff`` and the
    600 s of its ``HasExpiredFunc``)."""

    initial: float = 10.0
    maximum: float = 300.0
    reset_after: float = 600.0


#: What the kubelet uses for every container.
KUBELET_BACKOFF = BackOffPolicy()


class CrashBackOff:
    """One container's entry in the kubelet's ``flowcontrol.Backoff``; times are ``time.monotonic()`` seconds."""

    def __init__(self, policy: BackOffPolicy = KUBELET_BACKOFF) -> None:
        self.policy = policy
        #: The current back-off (``None``: no entry for the container).
        self.delay: float | None = None
        #: When ``next`` last ran: the container's last (re)start.
        self.last_update = 0.0

    def _expired(self, finished: float) -> bool:
        return finished - self.last_update > self.policy.reset_after

    def in_backoff_since(self, finished: float, now: float) -> bool:
        """``IsInBackOffSince``: whether a container that exited at ``finished`` must still wait at ``now``."""
        if self.delay is None or self._expired(finished):
            return False
        return now - finished < self.delay

    def next(self, finished: float, now: float) -> None:
        """``Next``: the container is being restarted at ``now``; the back-off its next exit owes grows."""
        if self.delay is None or self._expired(finished):
            self.delay = self.policy.initial
        else:
            self.delay = min(self.delay * 2, self.policy.maximum)
        self.last_update = now

    def due(self, finished: float) -> float:
        """When a container that exited at ``finished`` is restarted (``finished`` itself when at once)."""
        if self.delay is None or self._expired(finished):
            return finished
        return finished + self.delay


class PluginDaemon:
    """A plugin process run as a DaemonSet pod's only container; see the module docstring.

    ``kubelet`` returns the running kubelet (any object that is new on every kubelet start) or ``None`` while
    it is down; ``logger`` is the node's kubelet log. The process's log file records each restart.
    """

    def __init__(
        self,
        proc: PluginProcess,
        *,
        name: str,
        kubelet: Callable[[], object | None],
        logger: logging.Logger,
        policy: BackOffPolicy = KUBELET_BACKOFF,
        relist: float = 0.1,
        spacing: float = PLEG_RELIST_PERIOD_S,
    ) -> None:
        self.proc = proc
        self.name = name
        self._kubelet = kubelet
        self._logger = logger
        self._policy = policy
        self._relist = relist
        self._spacing = spacing
        #: When the process last started (``time.monotonic()``), ``None`` before its first start.
        self._started: float | None = None
        self._cond = threading.Condition()
        #: Down by the harness's hand (stop, kill, not started yet): never restarted until ``start``.
        self._held = True
        #: Times the kubelet started the process again since the harness last started it.
        self._restarts = 0
        self._backoff = CrashBackOff(policy)
        self._kubelet_seen: object | None = None
        #: When the kubelet noticed the current exit (``time.monotonic()``), ``None`` while it runs.
        self._finished: float | None = None
        self._waiting_logged = False
        self._generation = 0  # one supervising thread per harness start; an older one ends

    def __repr__(self) -> str:
        return f"PluginDaemon({self.name!r}, pid={self.pid}, running={self.running}, restarts={self.restarts})"

    # -- what the process is ------------------------------------------------------------------------------
    @property
    def argv(self) -> list[str]:
        return self.proc.argv

    @property
    def log_path(self) -> Path:
        return self.proc.log_path

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    @property
    def running(self) -> bool:
        return self.proc.running

    @property
    def restarts(self) -> int:
        """How many times the kubelet restarted the plugin since the harness started it (``restartCount``)."""
        with self._cond:
            return self._restarts

    def log(self) -> str:
        return self.proc.log()

    def wait(self, timeout: float | None = None) -> int | None:
        return self.proc.wait(timeout)

    # -- the harness's hand -------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the plugin as a new pod would: restart count 0, no back-off; the kubelet keeps it running (a
        process the kubelet restarted meanwhile is taken as the new pod's)."""
        early = self._too_early()
        if early > 0:
            self._logger.info(
                '"Starting container" container="%s" in %.2fs: a node starts it again no sooner', self.name, early
            )
            time.sleep(early)  # a node's latency, modelled: nothing to wait for but the clock
        with self._cond:
            if not self.proc.running:
                self._start_process()
            self._held, self._restarts, self._finished = False, 0, None
            self._backoff = CrashBackOff(self._policy)
            self._kubelet_seen = self._kubelet()
            self._generation += 1
            generation = self._generation
            self._cond.notify_all()
        threading.Thread(
            target=self._supervise, args=(generation,), name=f"devplug-daemon-{self.name}", daemon=True
        ).start()

    def _too_early(self) -> float:
        """Seconds until the process may start again (``spacing`` after its last start), 0 when it may now."""
        with self._cond:
            return 0.0 if self._started is None else max(self._started + self._spacing - time.monotonic(), 0.0)

    def _start_process(self) -> None:
        """``_cond`` held."""
        self._started = time.monotonic()
        self.proc.start()

    def _hold(self) -> None:
        with self._cond:
            self._held = True
            self._generation += 1
            self._cond.notify_all()

    def stop(self, timeout: float = 5.0) -> int | None:
        """SIGTERM (SIGKILL after ``timeout``); the plugin stays down until :meth:`start`."""
        self._hold()
        return self.proc.stop(timeout)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the plugin's process group; it stays down until :meth:`start` (the pod is gone)."""
        self._hold()
        self.proc.kill(sig)

    def restart(self, timeout: float = 5.0) -> None:
        """Stop, then start as a new pod (what a rollout of the DaemonSet does)."""
        self.stop(timeout)
        self.start()

    # -- the kubelet's side ---------------------------------------------------------------------------------
    def _supervise(self, generation: int) -> None:
        with self._cond:
            while self._generation == generation:
                self._relist_once()
                self._cond.wait(self._relist)

    def _see_kubelet(self) -> object | None:
        """The running kubelet (``_cond`` held); one that started since the last look remembers no back-off."""
        kubelet = self._kubelet()
        if kubelet is not self._kubelet_seen:
            self._kubelet_seen = kubelet
            if kubelet is not None:
                self._backoff = CrashBackOff(self._policy)
        return kubelet

    def _relist_once(self) -> None:
        """One look, as a PLEG relist and the pod sync after it would (``_cond`` held)."""
        kubelet = self._see_kubelet()
        if self._held or self.proc.running:
            return
        now = time.monotonic()
        if self._finished is None:
            self._finished = now
            self._waiting_logged = False
            self._logger.info(
                '"Container exited" container="%s" pid=%s exitCode=%s', self.name, self.proc.pid, self.proc.returncode
            )
        if kubelet is None:
            return  # nobody restarts it until a kubelet runs
        if self._backoff.in_backoff_since(self._finished, now):
            if not self._waiting_logged:
                self._waiting_logged = True
                self._logger.info(
                    '"Back-off restarting failed container" err="back-off %gs restarting failed container=%s"',
                    self._backoff.delay,
                    self.name,
                )
            return
        if self._started is not None and now < self._started + self._spacing:
            return  # started less than a relist period ago: a later relist restarts it
        self._backoff.next(self._finished, now)
        self._restarts += 1
        self._finished = None
        self._note(f"--- restarted by the kubelet (restartPolicy Always): restart {self._restarts}")
        try:
            self._start_process()
        except SimError as exc:
            # The runtime could not start it (StartError): an exit like any other for the back-off.
            self._note(f"--- start failed: {exc}")
            self._logger.error('"Error starting container" container="%s" err="%s"', self.name, exc)
            return
        self._logger.info(
            '"Restarted container" container="%s" pid=%s restartCount=%d', self.name, self.proc.pid, self._restarts
        )

    def _note(self, line: str) -> None:
        append_log(self.proc.log_path, line)

    def exit_reason(self) -> str | None:
        """Why the plugin is not running and will not come back soon by itself, or ``None`` (it runs, or the
        kubelet restarts it at once, or as soon as the kubelet runs again).

        Down by the harness's hand: how it exited. Crash-looping (the kubelet holds its restart back, as
        ``CrashLoopBackOff``): how it last exited, its restarts and the back-off.
        """
        with self._cond:
            rc = self.proc.returncode
            if rc is None:
                return None
            return _how(rc) if self._held else self._crash_loop(rc)

    def crash_loop(self) -> str | None:
        """How the plugin crash-loops while the kubelet holds its next restart back (``CrashLoopBackOff``), else
        ``None`` (it runs, is about to be restarted, or is down by the harness's hand)."""
        with self._cond:
            rc = self.proc.returncode
            return None if rc is None or self._held else self._crash_loop(rc)

    def _crash_loop(self, rc: int) -> str | None:
        """``_cond`` held; ``rc``: the exit status of the process, which the harness did not stop."""
        if self._see_kubelet() is None:
            return None
        now = time.monotonic()
        finished = now if self._finished is None else self._finished
        if not self._backoff.in_backoff_since(finished, now):
            return None
        left = max(self._backoff.due(finished) - now, 0.0)
        times = "time" if self._restarts == 1 else "times"
        return (
            f"{_how(rc)} and is crash-looping (CrashLoopBackOff): restarted {self._restarts} {times} by the kubelet, "
            f"back-off {self._backoff.delay:g} s (next start in {left:.0f} s)"
        )


def _how(rc: int) -> str:
    return f"exited with status {rc}" if rc >= 0 else f"killed by signal {-rc}"
