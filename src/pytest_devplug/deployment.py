"""The session's deployment of what is under test, a device plugin or a DRA driver, kept clean between tests.

Deployed once per session and judged ready once; after a test that changed it, started again where that restores
it, redeployed otherwise. What differs between a plugin and a driver (how to deploy it, when it is ready, what must
look as it did when it came up, how to remove it) is a :class:`Deployable`; the rest is :class:`SessionDeployment`'s,
so both sides fail, restore and recover a stopped kubelet by the same rules.
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

from .errors import PluginNotReadyError, UnsupportedOperationError
from .handles import NodeHandle, PluginChanges

__all__ = ["Deployable", "DeployedHandle", "SessionDeployment"]


class DeployedHandle(Protocol):
    """What the deployment does to a deployed plugin or driver itself (its handle reports these as changes)."""

    @property
    def running(self) -> bool: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...


H = TypeVar("H", bound=DeployedHandle)


class Deployable(Protocol[H]):
    """A device plugin or DRA driver as the session deploys it."""

    @property
    def what(self) -> str:
        """What it is, for messages: ``the plugin under test``."""

    @property
    def node(self) -> NodeHandle:
        """The node it runs on."""

    def deploy(self, changes: PluginChanges) -> H:
        """Deploy it, not waited for; its handle reports what tests do to it to ``changes``."""

    def wait_ready(self, handle: H) -> None:
        """Wait until it serves as deployed; an ``AssertionError`` saying why not."""

    def observe(self, handle: H) -> object:
        """What must equal its value when it came up for it to count as unchanged (compared with ``==``)."""

    def came_up(self, handle: H) -> None:
        """Once ready after a deploy: what is judged of it then, outside any test (warnings)."""

    def remove(self) -> None:
        """Remove it from its node."""


class SessionDeployment(Generic[H]):
    """The session's deployment of one :class:`Deployable`, restored after every test that left it changed.

    It owns the bookkeeping of what tests did to it (a :class:`~pytest_devplug.handles.PluginChanges` its handle
    reports to). Rules, the same for plugins and drivers:

    - a start that fails is reported in full by the test whose set-up waited for it; every later test fails at once
      with :class:`~pytest_devplug.errors.PluginNotReadyError` pointing there (one root cause, reported once);
    - a kubelet a test left stopped is started again before anything else is judged;
    - changed devices (a fault) are restored by a redeploy; a deployment only stopped, killed or restarted, or one
      that runs but shows something else than when it came up (a kubelet start deleted its slices), is restarted and
      waited for, and redeployed when that does not bring it back as it came up;
    - one deployed and never waited for (a registration check's) is left for the next test to wait for, unless the
      test changed it: then it is removed, and deployed afresh when next asked for.
    """

    def __init__(self, subject: Deployable[H]) -> None:
        self.subject = subject
        self.node = subject.node
        self.handle: H | None = None
        self.ready = False
        #: ``subject.observe`` when it came up.
        self.baseline: object = None
        self.failure: AssertionError | None = None
        self.failed_in = ""  # the test (or teardown) whose wait reported the failure in full
        self._changes = PluginChanges()

    def started(self) -> H:
        """Deployed, not waited for (registration checks judge registration themselves)."""
        if self.handle is None:
            self._changes = PluginChanges()
            self.handle = self.subject.deploy(self._changes)
            self.ready = False
        return self.handle

    def faults_handed_out(self) -> None:
        """An injector was handed out; one of a conftest does not report its changes, so assume it made some."""
        self._changes.note(devices=True)

    def get(self, test: str = "") -> H:
        """Deployed and ready; ``test`` names the caller in the message of later tests if it is not."""
        if self.failure is not None:
            first = (str(self.failure).splitlines() or [type(self.failure).__name__])[0]
            raise PluginNotReadyError(
                f"{self.subject.what} did not come up (reported in full in {self.failed_in or 'an earlier test'}): "
                f"{first[:300]}"
            )
        handle = self.started()
        if not self.ready:
            try:
                self.subject.wait_ready(handle)
            except AssertionError as exc:
                self.failure, self.failed_in = exc, test
                raise
            self.ready = True
            self.baseline = self.subject.observe(handle)
            self.subject.came_up(handle)
        return handle

    def reset_if_needed(self, test: str = "") -> None:
        """After a test (``test``: its id, for the message of a redeploy that fails): leave the deployment as the
        next test expects it."""
        h = self.handle
        if h is None:
            return
        if not self.node.kubelet_running:
            self.node.start_kubelet()  # a test that failed between stopping and starting it
        if not self.ready:
            if self._changes.touched or not h.running:
                self._remove()
            return
        if not self._changes.touched and h.running and self.subject.observe(h) == self.baseline:
            return
        if not self._changes.devices and self._restarted(h):
            self._changes.clear()
            return
        self._remove()
        self.get(f"the redeploy after {test}" if test else "a redeploy after an earlier test")

    def _remove(self) -> None:
        self.subject.remove()
        self.handle = None
        self.ready = False

    def _restarted(self, h: H) -> bool:
        """Started again (stopped first where it runs but differs: a driver publishes its slices again at once when it
        starts, its resync after a kubelet start may take 30 s) and back as it came up. Much cheaper than a redeploy
        on a real cluster, where removing a DaemonSet and creating it again waits for pod deletion and kubelet
        status updates."""
        if h.running and self.subject.observe(h) != self.baseline:
            try:
                h.stop()
            except UnsupportedOperationError:
                pass  # the backend cannot (an adopted plugin): waited for as it runs
        if not h.running:
            h.start()  # through the handle: its waits give up on a crash again
        try:
            self.subject.wait_ready(h)
        except AssertionError:
            return False
        return self.subject.observe(h) == self.baseline
