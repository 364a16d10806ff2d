"""A run interrupted in a test that uses the plugin (Ctrl-C; SIGTERM on a real cluster) ends as interrupted.

After an interrupt pytest tears the test's fixtures down at session end, when the item's ``funcargs`` are
already gone; the plugin fixture's teardown read them and turned a clean interrupt into an internal error
(exit 1; seen on kind, where the cleanup of the cluster comes right after).
"""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]


def test_an_interrupt_in_a_plugin_test_tears_down_cleanly(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        def test_interrupted(devplug_plugin):
            raise KeyboardInterrupt("stop")
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.INTERRUPTED, result.stdout.str()[-3000:]
    assert "TypeError" not in result.stdout.str() + result.stderr.str()
