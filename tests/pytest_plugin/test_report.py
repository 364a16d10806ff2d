"""``--devplug-report``: the Markdown and JSON reports say, per check, what pytest said; ``--junitxml`` still works."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CHECKS = """
import pytest

@pytest.fixture
def broken():
    raise RuntimeError("set-up broke")

def test_ok():
    pass

def test_bad():
    assert 1 == 2, "one is not two"

def test_skipped():
    pytest.skip("test_skipped: no NUMA topology")  # a reason labelled with the test's name, as fixtures' are

def test_setup_error(broken):
    pass

@pytest.fixture
def devplug_faults():
    return None

def test_fault(devplug_faults):
    pass

@pytest.mark.devplug_mock
def test_fault_by_marker():
    pass

@pytest.mark.devplug_convention
def test_convention():
    pass
"""


def test_report_rows_groups_and_junitxml(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nmarkers = devplug_convention: opt-in\n")
    pytester.makepyfile(test_checks=CHECKS)
    result = pytester.runpytest("--devplug-report=out/report.md", "--junitxml=junit.xml", "-k", "not deselected")
    result.assert_outcomes(passed=4, failed=1, skipped=1, errors=1)
    result.stdout.fnmatch_lines(["devplug report: out/report.md (JSON: out/report.json)"])

    data = json.loads((pytester.path / "out" / "report.json").read_text())
    checks = {c["name"]: c for c in data["checks"]}
    assert {n: (c["group"], c["outcome"]) for n, c in checks.items()} == {
        "checks: test_ok": ("core", "passed"),
        "checks: test_bad": ("core", "failed"),
        "checks: test_skipped": ("core", "skipped"),
        "checks: test_setup_error": ("core", "error"),
        "checks: test_fault": ("faults", "passed"),
        "checks: test_fault_by_marker": ("faults", "passed"),
        "checks: test_convention": ("conventions", "passed"),
    }
    assert "one is not two" in checks["checks: test_bad"]["reason"]
    assert checks["checks: test_skipped"]["reason"] == "no NUMA topology"
    assert checks["checks: test_setup_error"]["reason"] == "in setup: RuntimeError: set-up broke"
    assert data["summary"] == {"passed": 4, "failed": 1, "skipped": 1, "error": 1}
    assert [c["group"] for c in data["checks"]] == ["core"] * 4 + ["conventions"] + ["faults"] * 2
    assert data["run"]["plugin"] == ""  # no devplug fixture ran: nothing was deployed

    md = (pytester.path / "out" / "report.md").read_text()
    assert "| result | 4 passed, 1 failed, 1 error, 1 skipped in " in md
    assert "| `checks: test_skipped` | skipped | " in md and "| `checks: test_bad` | **FAILED** | " in md
    assert md.index("## Core") < md.index("## Conventions") < md.index("## Fault injection")
    assert "(no plugin was deployed in this run)" in md

    junit = ET.parse(pytester.path / "junit.xml").getroot()
    assert junit.find("testsuite") is not None and int(junit.find("testsuite").get("tests", "0")) == 7  # type: ignore[union-attr]


def test_a_checks_devplug_properties_are_notes_in_its_row(pytester: pytest.Pytester) -> None:
    """How a check ran (a staged reboot) reaches its row (``note_check``, a ``devplug_`` user property), beside the
    failure's reason where there is one; other properties stay in junit only."""
    pytester.makepyfile(
        test_notes="""
        from pytest_devplug.report import note_check

        def test_staged(request, record_property):
            note_check(request.node, "reboot", "staged: kubelet stopped")
            record_property("owner", "someone")

        def test_staged_and_failed(request):
            note_check(request.node, "reboot", "staged: kubelet stopped")
            assert False, "the pod did not come back"
        """
    )
    pytester.runpytest("--devplug-report=r.md").assert_outcomes(passed=1, failed=1)
    checks = {c["name"]: c for c in json.loads((pytester.path / "r.json").read_text())["checks"]}
    assert checks["notes: test_staged"]["notes"] == ["reboot: staged: kubelet stopped"]
    md = (pytester.path / "r.md").read_text()
    assert "| passed | " in md and "reboot: staged: kubelet stopped |" in md and "someone" not in md
    assert "the pod did not come back assert False; reboot: staged: kubelet stopped |" in md


def test_report_header_names_the_plugin_resource_and_backend(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_one="""
        def test_registered(devplug_plugin):
            assert devplug_plugin.running
        """
    )
    pytester.runpytest("--devplug-report=r.md", "--devplug-gpus=2").assert_outcomes(passed=1)
    data = json.loads((pytester.path / "r.json").read_text())
    assert data["run"]["backend"] == "sim" and data["run"]["resource"] == "nvidia.com/gpu"
    assert "-m devplug_gpu_plugin" in data["run"]["plugin"] and data["run"]["mock"] is True
    md = (pytester.path / "r.md").read_text()
    assert "| backend | sim (embedded kubelet) |" in md and "| resource | `nvidia.com/gpu` |" in md


def test_a_dra_run_describes_its_driver_in_the_header_and_the_report(pytester: pytest.Pytester) -> None:
    """A driver command makes the run a DRA run: the header and the report describe the driver, not the device
    plugin (nothing deployed here: the driver's row says so)."""
    pytester.makepyfile(test_x="def test_x(): pass")
    cmd = "{python} my_driver.py --registry {plugins_registry}"
    result = pytester.runpytest(
        f"--devplug-driver-cmd={cmd}", "--devplug-driver-name=widget.example.com", "--devplug-report=r.md"
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "devplug: backend=sim, kubernetes *; driver=widget.example.com mock=False DRA driver: "
            "'{python}' my_driver.py --registry '{plugins_registry}' "
            "(with the node's paths as flags)"
        ]
    )
    assert "plugin: " not in result.stdout.str(), "the device plugin is not what a DRA run tests"
    data = json.loads((pytester.path / "r.json").read_text())
    assert data["run"]["subject"] == "dra-driver" and data["run"]["driver"] == "", data["run"]
    md = (pytester.path / "r.md").read_text()
    assert md.startswith("# DRA driver conformance report\n"), md
    assert "| DRA driver | (no DRA driver was deployed in this run) |" in md and "| plugin |" not in md, md


def test_the_dra_suite_and_a_conftest_driver_make_a_dra_run(pytester: pytest.Pytester) -> None:
    """With no driver option: the DRA suite named on the command line (the included driver is then under test), or
    a conftest's own ``devplug_driver_spec`` (printed when deployed, as for ``devplug_plugin_spec``)."""
    result = pytester.runpytest("--pyargs", "pytest_devplug.dra.conformance", "--collect-only")
    result.stdout.fnmatch_lines(
        [
            "devplug: backend=sim, kubernetes *; driver=gpu.devplug.io mock=True DRA driver: "
            "* -m devplug_gpu_plugin --dra *"
        ]
    )
    pytester.makeconftest(
        """
        import pytest
        from pytest_devplug.dra import DriverSpec

        @pytest.fixture(scope="session")
        def devplug_driver_spec():
            return DriverSpec(driver_name="mine.example.com", argv=["./mine"])
        """
    )
    pytester.makepyfile(test_x="def test_x(): pass")
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "devplug: backend=sim, kubernetes *; devplug_driver_spec is overridden in "
            "conftest.py: the DRA driver under test is printed when it is deployed"
        ]
    )


def test_report_refuses_a_json_target(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_x="def test_x(): pass")
    result = pytester.runpytest("--devplug-report=report.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--devplug-report report.json: give the Markdown file*"])
    assert not Path(pytester.path / "report.json").exists()


WIDGET = str(Path(__file__).resolve().parents[1] / "fixture_plugins" / "widget.py")
WIDGET_OPTIONS = ("--devplug-resource-name=example.com/widget", "-p", "no:randomly")


def test_report_counts_the_plugins_restarts_per_check(pytester: pytest.Pytester) -> None:
    """A plugin that exits by itself is restarted by the kubelet (its DaemonSet's pod would be): the check during
    which that happened says so, even when it passed, and the header sums it up."""
    pytester.makepyfile(
        test_restarts="""
        from pytest_devplug import assert_reregisters_after_kubelet_restart

        def test_before(devplug_plugin):
            pass

        def test_kubelet_restart(devplug_plugin):
            assert_reregisters_after_kubelet_restart(devplug_plugin)  # the widget exits on the new kubelet.sock

        def test_after(devplug_plugin):
            pass
        """
    )
    cmd = f"{{python}} {WIDGET} --plugin-dir {{plugin_dir}} --exit-on-kubelet-restart"
    pytester.runpytest(f"--devplug-plugin-cmd={cmd}", "--devplug-report=r.md", *WIDGET_OPTIONS).assert_outcomes(
        passed=3
    )
    data = json.loads((pytester.path / "r.json").read_text())
    assert {c["name"]: (c["plugin_restarts"], c["plugin_crash_loop"]) for c in data["checks"]} == {
        "restarts: test_before": (0, ""),
        "restarts: test_kubelet_restart": (1, ""),
        "restarts: test_after": (0, ""),
    }
    assert data["run"]["plugin_restarts"] == 1 and data["run"]["plugin_crash_loop"] == ""
    md = (pytester.path / "r.md").read_text()
    assert "| plugin restarts | 1 by the kubelet: the plugin exited by itself and was started again" in md, md
    assert "| check | verdict | duration | plugin | reason |" in md, md
    assert "| `restarts: test_kubelet_restart` | passed | " in md and " s | 1 restart |  |" in md, md
    assert "crash loop" not in md, md


def test_report_names_a_crash_looping_plugin(pytester: pytest.Pytester) -> None:
    """A plugin that exits at every start is restarted once at once, then held back (CrashLoopBackOff): the report
    says it crash-loops, beside the error of the check that waited for it."""
    pytester.makepyfile(test_loop="def test_registered(devplug_plugin):\n    pass\n")
    cmd = f"{{python}} {WIDGET} --plugin-dir {{plugin_dir}} --fault exit-at-start"
    pytester.runpytest(f"--devplug-plugin-cmd={cmd}", "--devplug-report=loop.md", *WIDGET_OPTIONS).assert_outcomes(
        errors=1
    )
    data = json.loads((pytester.path / "loop.json").read_text())
    (check,) = data["checks"]
    assert check["outcome"] == "error" and check["plugin_restarts"] == 1, check
    assert check["plugin_crash_loop"].startswith(
        "exited with status 3 and is crash-looping (CrashLoopBackOff): restarted 1 time by the kubelet, back-off 10 s"
    ), check
    assert data["run"]["plugin_restarts"] == 1 and data["run"]["plugin_crash_loop"] == check["plugin_crash_loop"]
    md = (pytester.path / "loop.md").read_text()
    assert (
        "| crash loop | **the plugin crash-looped** (seen in 1 check): exited with status 3 and is crash-looping" in md
    ), md
    assert (
        "| `loop: test_registered` | **ERROR** | " in md and " s | **crash-looping**, 1 restart | in setup: " in md
    ), md
