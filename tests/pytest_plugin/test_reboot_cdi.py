"""The device-plugin suite's reboot check on a node whose ``/run`` the reboot emptied: a plugin answering CDI devices
must write its spec again when it starts after a reboot, or every container asking for its devices is refused.

The widget runs at the kubelet's standard paths (no ``{plugin_dir}``), its CDI root at ``/var/run/cdi`` there.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ..support import run_conformance

WIDGET = Path(__file__).resolve().parents[1] / "fixture_plugins" / "widget.py"
CHECK = "test_node_reboot_then_plugin_comes_back"
SUITE_TIMEOUT_S = 300


def _run(tmp_path: Path, *extra: str) -> tuple[list[str], str, str]:
    cmd = f"{sys.executable} {WIDGET} --retry --cdi-root /var/run/cdi {' '.join(extra)}"
    result = run_conformance(
        ["--plugin-cmd", cmd, "--resource-name", "example.com/widget"], ["-k", CHECK], tmp_path, timeout=SUITE_TIMEOUT_S
    )
    return sorted(result.passed), "\n".join(result.failed), result.output


def test_reboot_check_passes_a_plugin_that_writes_its_cdi_spec_at_every_start(tmp_path: Path) -> None:
    passed, failed, output = _run(tmp_path)
    assert passed == [CHECK], f"expected {CHECK} to pass on the widget with CDI devices; failed: {failed}\n{output}"


@pytest.mark.parametrize("fault", ["cdi-spec-once"])
def test_reboot_check_fails_a_plugin_whose_cdi_spec_does_not_survive_the_reboot(tmp_path: Path, fault: str) -> None:
    passed, failed, output = _run(tmp_path, "--fault", fault)
    assert not passed, (
        f"{CHECK} passed a plugin that writes its CDI spec only once, before the reboot emptied /var/run/cdi"
    )
    assert "CDI device injection failed: unresolvable CDI devices example.com/widget=" in failed + output, (
        f"{CHECK} failed, but not for the CDI devices the emptied /var/run/cdi no longer defines:\n{failed}\n{output}"
    )
