"""The suite's registration and restart checks judge a plugin that registers through the kubelet's plugin watcher
(``plugins_registry/``) as they judge one that calls ``Register``, and the report says which way each used: the
included plugin with ``DP_REGISTRATION=plugins_registry`` (``--plugin-env``) and with its default."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_devplug.assertions import INFERRED_WATCHER_PATH
from tests.support import run_conformance

#: The checks about registering and registering again, and the restarts that depend on it.
SELECTION = (
    "test_registers_its_resource or test_registration_accepted_without_errors or "
    "test_reregisters_after_kubelet_restart or test_kubelet_restart_then_plugin_restart"
)
NOTED = ("test_registers_its_resource", "test_reregisters_after_kubelet_restart")


#: Its own cluster when run alone; `nox -s e2e` points it at the shared one (DEVPLUG_KIND_CLUSTER) and a node of its
#: own (--devplug-node through PYTEST_ADDOPTS, tools/e2e-lanes.sh).
KIND_CLUSTER = "devplug-watcher"


def _notes(report: Path) -> dict[str, list[str]]:
    checks = json.loads(report.with_suffix(".json").read_text())["checks"]
    return {c["name"].rsplit(" ", 1)[-1].split(":")[-1].strip(): c.get("notes", []) for c in checks}


@pytest.mark.parametrize(
    ("env", "path"),
    [
        ("DP_REGISTRATION=plugins_registry,DP_KUBELET_REGISTRAR_DIR={plugins_registry}", "plugins_registry"),
        ("", "kubelet.sock"),
    ],
    ids=["plugins_registry", "kubelet.sock"],
)
def test_registration_checks_pass_either_way_and_say_which(tmp_path: Path, env: str, path: str) -> None:
    report = tmp_path / "report.md"
    options = ["--report", str(report), *(["--plugin-env", env] if env else [])]
    result = run_conformance(options, ["-k", SELECTION], tmp_path, timeout=600)
    assert not result.failed and result.returncode == 0, "\n".join(result.failed) + "\n" + result.output
    assert sorted(result.passed) == sorted(SELECTION.split(" or ")), result.verdicts()
    notes = _notes(report)
    for check in NOTED:
        assert notes[check] == [f"registration: {path}"], notes


@pytest.mark.kind
def test_registration_checks_pass_through_the_plugin_watcher_on_kind(tmp_path: Path) -> None:
    """The same on a real kubelet: the included plugin's DaemonSet with ``DP_REGISTRATION=plugins_registry`` (its socket
    in the node's ``/var/lib/kubelet/plugins_registry``, found by the kubelet's own plugin watcher). The e2e cluster's
    kubelets log at the default verbosity, where the watcher's registrations are not logged: the report says so."""
    report = tmp_path / "report.md"
    options = [
        "--backend",
        "kind",
        "--timeout",
        "60",
        "--report",
        str(report),
        "--plugin-env",
        "DP_REGISTRATION=plugins_registry",
    ]
    result = run_conformance(options, ["-k", SELECTION, f"--cluster-name={KIND_CLUSTER}"], tmp_path, timeout=1800)
    assert not result.failed and result.returncode == 0, "\n".join(result.failed) + "\n" + result.output
    assert sorted(result.passed) == sorted(SELECTION.split(" or ")), result.verdicts()
    notes = _notes(report)
    for check in NOTED:
        assert notes[check] in (["registration: plugins_registry"], [f"registration: {INFERRED_WATCHER_PATH}"]), notes[
            check
        ]
