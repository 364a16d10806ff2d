"""Long-lived connection: one registration held for ``--devplug-soak`` seconds (overlapped with the suite)."""

from __future__ import annotations

import pytest

from pytest_devplug import ClusterHandle
from pytest_devplug.soakwatch import SoakWatch


@pytest.mark.devplug_soak
def test_listandwatch_stream_held_for_soak_time(devplug_soak: SoakWatch, devplug_cluster: ClusterHandle) -> None:
    """A copy of the plugin, registered when the session's first test began and touched by nothing since, is
    still registered with every device after the soak time: its server did not end ``ListAndWatch`` (the kubelet
    never redials), and it did not exit."""
    if devplug_soak.seconds == 0:
        pytest.skip("the soak is switched off (--devplug-soak 0)")
    devplug_soak.verdict(devplug_cluster.timeout)
