"""Several resources from one plugin process, through the user's entry point: ``devplug conformance --resource-name
a,b`` runs the included plugin with ``--second-resource`` and the several-resources checks judge both resources
(with one resource they skip at once, saying so). The other new checks of the plugin under test (PreStartContainer
failing, pod-resources ``Get``, health of a pod that never started, the rolling update) run in the same pass."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

CHECKS = (
    "test_every_resource_registers_and_allocates",
    "test_every_resource_reregisters_after_kubelet_restart",
    "test_failing_prestart_keeps_the_container_from_starting",
    "test_pod_resources_get_lists_one_pod",
    "test_device_health_reported_for_a_pod_that_never_started",
    "test_convention_rolling_update_without_downtime",
)


def test_two_resources_of_the_included_plugin_pass_the_new_checks(tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    devplug = os.path.join(os.path.dirname(sys.executable), "devplug")
    argv = [devplug, "conformance", "--backend", "sim", "--resource-name", "nvidia.com/gpu,example.com/gpu-half", "--",
            "-p", "no:randomly", "-k", " or ".join(CHECKS), f"--junitxml={junit}", "--devplug-soak=0"]  # fmt: skip
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False)
    output = (done.stdout + done.stderr)[-6000:]
    assert junit.exists(), f"devplug conformance exited {done.returncode} without a report:\n{output}"
    outcome = {}
    for case in ET.parse(junit).iter("testcase"):
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        outcome[case.get("name")] = "failed" if bad is not None else "skipped" if case.find("skipped") is not None else "passed"
    assert outcome == dict.fromkeys(CHECKS, "passed"), f"{outcome}\n{output}"
    assert done.returncode == 0, output
