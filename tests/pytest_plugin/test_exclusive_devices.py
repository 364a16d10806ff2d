"""Plugins that share a device by design pass the suite (the kubelet requires distinct device IDs, nothing of device
nodes), and the opt-in ``exclusive-devices`` convention catches a plugin that hands one exclusive device to two
containers (its Allocate answers one device with another device's node), saying which node and which pods."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.support import run_conformance

WIDGET = Path(__file__).resolve().parents[1] / "fixture_plugins" / "widget.py"
CHECK = "test_convention_exclusive_devices_reach_one_container"


def _widget(*flags: str) -> list[str]:
    cmd = f"{sys.executable} {WIDGET} --plugin-dir {{plugin_dir}} --retry --count 4 {' '.join(flags)}"
    return ["--plugin-cmd", cmd, "--resource-name", "example.com/widget"]


def test_a_plugin_sharing_one_device_by_design_passes_the_suite(tmp_path: Path) -> None:
    """Every ID a share of ``/dev/widget``: no check fails it (the checks that need a fault injector or a convention
    it does not declare skip)."""
    result = run_conformance(_widget("--shared"), [], tmp_path, timeout=600)
    assert not result.failed and result.returncode == 0, "\n".join(result.failed) + result.output
    assert "test_pods_never_share_a_device" in result.passed and CHECK in result.skipped, result.verdicts()


def test_exclusive_devices_convention_passes_a_correct_plugin_and_fails_one_device_given_twice(tmp_path: Path) -> None:
    for run in ("good", "bad"):
        (tmp_path / run).mkdir()
    good = run_conformance(
        [*_widget("--host-nodes"), "--conventions", "exclusive-devices"], ["-k", CHECK], tmp_path / "good", timeout=600
    )
    assert good.passed == [CHECK], good.verdicts()
    bad = run_conformance(
        [*_widget("--host-nodes", "--fault", "node-of-another"), "--conventions", "exclusive-devices"],
        ["-k", CHECK],
        tmp_path / "bad",
        timeout=600,
    )
    assert list(bad.failures) == [CHECK], bad.verdicts()
    message = bad.failures[CHECK]
    assert "device nodes given to pods holding different example.com/widget devices: {'/dev/widget-0': [" in message, (
        message
    )
    assert "(widget-0)" in message and "(widget-1)" in message and "one device handed to two containers" in message, (
        message
    )
