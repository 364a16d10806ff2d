"""``devplug conformance`` tests exactly the plugin on its command line, whatever the current directory holds;
the report shows the plugin actually under test, also when a conftest overrides ``devplug_plugin_spec``."""

from __future__ import annotations

import os
import sys

import pytest

pytest_plugins = ["pytester"]

DEVPLUG = os.path.join(os.path.dirname(sys.executable), "devplug")

#: A plugin project's conftest pointing the fixtures at a plugin that does not exist.
OVERRIDING_CONFTEST = """
import sys
import pytest
from pytest_devplug import PluginSpec

@pytest.fixture(scope="session")
def devplug_plugin_spec():
    return PluginSpec(resource_name="example.com/wrong", argv=(sys.executable, "-m", "no_such_plugin_module"),
                      mock=False, pre_start_required=False)
"""

#: Each ini flavour pytest reads, with addopts that would select no conformance test at all.
INI_FILES = {
    "pytest.ini": "[pytest]\naddopts = -k this_selects_no_test\n",
    "pyproject.toml": '[tool.pytest.ini_options]\naddopts = "-k this_selects_no_test"\n',
    "tox.ini": "[pytest]\naddopts = -k this_selects_no_test\n",
    "setup.cfg": "[tool:pytest]\naddopts = -k this_selects_no_test\n",
}

#: The included GPU plugin under a resource name of this test's own, given on the command line.
PLUGIN_CMD = (
    "{python} -m devplug_gpu_plugin --plugin-dir {plugin_dir} --resource-name example.com/isolated "
    "--nvml mock --mock-state {mock_state}"
)


@pytest.mark.parametrize("ini", sorted(INI_FILES))
def test_conformance_ignores_the_cwds_ini_and_conftests(pytester: pytest.Pytester, ini: str) -> None:
    pytester.makefile("", **{ini: INI_FILES[ini]})
    boom = "raise RuntimeError('the current directory conftest was loaded')\n"
    pytester.makeconftest(boom)
    pytester.mkdir("tests").joinpath("conftest.py").write_text(boom)
    result = pytester.run(DEVPLUG, "conformance", "--", "--collect-only", timeout=120)
    assert result.ret == 0, result.stdout.str()[-4000:] + result.stderr.str()[-2000:]
    result.stdout.fnmatch_lines(["*<Function test_registers_its_resource>", "*48 tests collected*"])
    assert "this_selects_no_test" not in result.stdout.str()


def test_conformance_tests_the_plugin_on_its_command_line(pytester: pytest.Pytester) -> None:
    """A project's tests/conftest.py names a missing plugin; `devplug conformance --plugin-cmd` run from the
    project root must still test (and show) the command-line plugin. It used to report the missing one as
    failing registration, under a header naming the command-line plugin."""
    pytester.makefile("", **{"pytest.ini": INI_FILES["pytest.ini"]})
    pytester.mkdir("tests").joinpath("conftest.py").write_text(OVERRIDING_CONFTEST)
    result = pytester.run(
        DEVPLUG,
        "conformance",
        "--plugin-cmd",
        PLUGIN_CMD,
        "--resource-name",
        "example.com/isolated",
        "--mock",
        "--timeout",
        "15",
        "--",
        "-k",
        "test_registers_its_resource or test_registration_accepted_without_errors",
        timeout=180,
    )
    out = result.stdout.str()
    assert result.ret == 0, out[-6000:]
    assert result.parseoutcomes().get("passed") == 2, out[-3000:]
    result.stdout.fnmatch_lines(
        [
            "devplug: backend=sim, kubernetes *; resource=example.com/isolated mock=True plugin: "
            "* -m devplug_gpu_plugin *"
        ]
    )
    result.stdout.fnmatch_lines(["configfile: pytest.ini"])
    assert "dev/null" not in out and "no_such_plugin_module" not in out and "example.com/wrong" not in out


PLAIN_TEST = """
def test_deployed(devplug_plugin_started):
    assert devplug_plugin_started.resource_name == "example.com/wrong"
"""


def test_plain_run_reports_the_overriding_conftests_plugin(pytester: pytest.Pytester) -> None:
    pytester.mkdir("tests").joinpath("conftest.py").write_text(OVERRIDING_CONFTEST)
    pytester.path.joinpath("tests", "test_plain.py").write_text(PLAIN_TEST)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly", "tests", timeout=120)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "devplug: backend=sim, kubernetes *; devplug_plugin_spec is overridden in tests/conftest.py: "
            "*printed when it is deployed",
            "devplug: plugin under test (from devplug_plugin_spec): resource=example.com/wrong mock=False plugin: "
            "* -m no_such_plugin_module",
        ]
    )


def test_plain_run_without_override_shows_the_options_plugin_once(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_plain=PLAIN_TEST.replace("example.com/wrong", "example.com/opt"))
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:randomly", "--devplug-resource-name=example.com/opt", timeout=120
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["devplug: backend=sim, kubernetes *; resource=example.com/opt mock=True plugin: * -m devplug_gpu_plugin *"]
    )
    assert "plugin under test (from devplug_plugin_spec)" not in result.stdout.str()
