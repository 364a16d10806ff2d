"""The long-lived connection check: one registration held for ``--devplug-soak`` seconds beside the suite.

The suite's own checks redeploy and restart the plugin every few seconds, so a plugin whose server ends
``ListAndWatch`` after a while (an idle or connection-age limit, an exception in its health loop) passes them:
no single connection lives long enough. The kubelet never redials such a stream (allocatable 0 until the
plugin registers again). So a second copy of the plugin runs on a node of its own, started with the first
test that runs, untouched by every other test, and the soak check (run last) waits until it has been
registered for the soak time: overlapped with the suite, not added to it.
"""

from __future__ import annotations

import time
from dataclasses import replace

from .backends.base import NodeSpec, PluginSpec
from .errors import UnsupportedOperationError, WaitTimeout
from .handles import ClusterHandle, NodeHandle, PluginHandle
from .waiting import wait_for
from .watch import Watch

__all__ = ["SOAK_MARKER", "SOAK_NODE", "DEFAULT_SOAK_S", "SoakWatch"]

SOAK_MARKER = "devplug_soak"
#: The node the soaking copy of the plugin runs on.
SOAK_NODE = "devplug-soak"
#: Seconds one registration is held (``--devplug-soak``): longer than the suite's own plugin lifetimes, short
#: enough to hide behind the suite's run time on the embedded kubelet.
DEFAULT_SOAK_S = 30.0


class SoakWatch(Watch):
    """A copy of the plugin on :data:`SOAK_NODE`, registered once and watched until the soak time is over."""

    def __init__(
        self,
        cluster: ClusterHandle,
        spec: PluginSpec,
        seconds: float,
        main_node: str,
        node_like: NodeSpec | None = None,
    ) -> None:
        self.cluster, self.spec, self.seconds, self.main_node = cluster, spec, seconds, main_node
        #: The node under test's spec: the soak's node is made like it (its device nodes, its PCI node).
        self.node_like = node_like or NodeSpec(
            main_node, numa_nodes=max(spec.numa_nodes, 1), resource_name=spec.resource_name
        )
        self.node: NodeHandle | None = None
        self.plugin: PluginHandle | None = None
        self.registered_at: float | None = None
        #: (capacity, allocatable) right after the registration: what the soak must still see at its end.
        self.expected: tuple[int | None, int | None] = (None, None)
        #: Why no soak runs on this backend (a check asking for a verdict skips quoting it).
        self.unsupported: str | None = None
        #: Why the soaking copy did not come up (the check fails quoting it).
        self.failed_start: str | None = None

    def start(self) -> None:
        """Deploy and wait for the first registration; never raises for the plugin's faults (the verdict does)."""
        if self.seconds == 0:
            return
        spec = replace(self.node_like, name=SOAK_NODE, beside=self.main_node)
        try:
            node = self.cluster.ensure_node(spec)
        except UnsupportedOperationError as exc:
            self.unsupported = f"the soak runs a copy of the plugin on a node of its own: {exc}"
            return
        if node.name == self.main_node:
            self.unsupported = (
                f"the soak needs a node of its own beside {self.main_node}; the {self.cluster.backend.name} backend "
                "gave the same node"
            )
            return
        self.node = node
        self.plugin = self.cluster.deploy(node, self.spec)
        try:
            self.plugin.wait_listed()  # what ListAndWatch lists (replicas: more than the mock GPUs)
        except AssertionError as exc:
            self.failed_start = str(exc).splitlines()[0]
            return
        self.registered_at = time.monotonic()
        self.expected = node.counts(self.spec.resource_name)

    def verdict(self, timeout: float) -> None:
        """Wait (bounded) until the registration has lived ``seconds``; fail as soon as it is lost."""
        if self.unsupported is not None:
            raise UnsupportedOperationError(self.unsupported)
        if self.failed_start is not None or self.node is None or self.plugin is None or self.registered_at is None:
            raise AssertionError(f"the soaking copy of the plugin never registered: {self.failed_start}")
        node, plugin, res, start = self.node, self.plugin, self.spec.resource_name, self.registered_at
        want = self.expected

        def sample() -> tuple[tuple[int | None, int | None], float]:
            return node.counts(res), time.monotonic() - start

        try:
            (counts, held) = wait_for(
                sample,
                lambda v: v[0] != want or v[1] >= self.seconds,
                timeout=max(self.seconds - (time.monotonic() - start), 0.0) + timeout,
                what=f"{res} registered on {node.name} for {self.seconds:g}s",
                interval=0.5,
            )
        except WaitTimeout as exc:
            raise AssertionError(f"the soak did not finish: {exc}") from None
        if counts == want and (counts[1] or 0) > 0:
            return
        ended = [ln for ln in node.kubelet_log().splitlines() if "ListAndWatch ended" in ln or "became unhealthy" in ln]
        exited = plugin.exited()
        raise AssertionError(
            f"{res}: the plugin's registration was found lost {held:.1f}s after it registered (soak {self.seconds:g}s, "
            "nothing touched it; the kubelet lines below say when it ended): "
            f"(capacity, allocatable) {want} -> {counts}. "
            + (
                f"{exited[0].upper()}{exited[1:]}. "
                if exited
                else "The plugin process still runs: its server ended the stream. "
            )
            + "The kubelet never redials a ListAndWatch stream that ended"
            + (":\n    " + "\n    ".join(ended[-4:]) if ended else " (no kubelet line about it)")
        )

    def close(self) -> None:
        if self.node is not None and self.plugin is not None:
            self.cluster.backend.remove_plugin(self.node.name)
