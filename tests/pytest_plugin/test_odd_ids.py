"""Device IDs with control characters (one plugin sends ``'\\x00'``, ``'\\x01'``, ... from a ``string(uint)`` bug):
the kubelet accepts them, the harness reports them as a warning."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pytest_devplug.plugin import DevplugWarning, _warn_odd_ids

pytest_plugins = ["pytester"]
WIDGET = Path(__file__).resolve().parents[1] / "fixture_plugins" / "widget.py"


def test_control_characters_warn_and_ordinary_ids_do_not() -> None:
    with pytest.warns(
        DevplugWarning, match=r"example.com/w: device IDs with control characters: \['\\x00', 'a\\x7f'\]"
    ):
        _warn_odd_ids("example.com/w", ["\x00", "ok-1", "a\x7f"])
    _warn_odd_ids("example.com/w", ["GPU-1::0", "card0-0", "Dev-1"])  # no warning (pytest errors on one here)


def test_a_plugin_listing_control_characters_gets_the_warning(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        f"""
import pytest
from pytest_devplug import PluginSpec

@pytest.fixture(scope="session")
def devplug_plugin_spec():
    return PluginSpec(
        resource_name="example.com/widget",
        argv=[{sys.executable!r}, {str(WIDGET)!r}, "--plugin-dir", "{{plugin_dir}}", "--fault", "control-ids"],
    )
"""
    )
    pytester.makepyfile(
        "def test_it(devplug_plugin):\n    assert devplug_plugin.node.allocatable('example.com/widget') == 3\n"
    )
    result = pytester.runpytest_subprocess("-p", "no:randomly")
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines(["*DevplugWarning: example.com/widget: device IDs with control characters:*\\x00*"])
