"""What a user without an extra sees: at once, a message naming what to install or pass (no wait, no traceback)."""

from __future__ import annotations

import sys
import time

import pytest

import pytest_devplug.plugin
from pytest_devplug import cli
from pytest_devplug.backends import create_backend, missing_kind_dependencies
from pytest_devplug.backends.base import BackendOptions
from pytest_devplug.errors import BackendUnavailableError

pytest_plugins = ["pytester"]


def test_no_plugin_option_and_no_included_plugin_stops_at_once(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pytest_devplug.plugin, "included_plugin_installed", lambda: False)
    pytester.makepyfile(test_one="def test_one(devplug_plugin): pass\ndef test_two(devplug_plugin): pass")
    t0 = time.monotonic()
    result = pytester.runpytest("--devplug-timeout=3600")
    # A registration wait would last the hour-long timeout; far less proves none happened, on any load.
    assert time.monotonic() - t0 < 600
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    out = result.stdout.str() + result.stderr.str()
    assert "pip install 'pytest-devplug[gpu-plugin]'" in out and "--devplug-plugin-cmd" in out


def test_a_plugin_option_needs_no_included_plugin(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pytest_devplug.plugin, "included_plugin_installed", lambda: False)
    pytester.makepyfile(test_one="def test_spec(devplug_plugin_spec): assert devplug_plugin_spec.argv[-1] == 'x'")
    pytester.runpytest("--devplug-plugin-cmd={python} -c pass x").assert_outcomes(passed=1)


def test_cli_without_plugin_names_the_extra_and_the_option(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(pytest_devplug.plugin, "included_plugin_installed", lambda: False)
    assert cli.main(["conformance"]) == pytest.ExitCode.USAGE_ERROR
    err = capsys.readouterr().err
    assert err.startswith("devplug conformance: no device plugin to test")
    assert "pip install 'pytest-devplug[gpu-plugin]'" in err and "--plugin-cmd" in err


def test_kind_backend_without_the_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pytest_kind", None)  # as if pytest-kind-ng were not installed
    assert missing_kind_dependencies() == ["pytest-kind-ng"]
    with pytest.raises(BackendUnavailableError, match=r"needs pytest-kind-ng.*pip install 'pytest-devplug\[kind\]'"):
        create_backend("kind", BackendOptions())


def test_cluster_backend_without_its_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "kubernetes", None)  # as if the Kubernetes client were not installed
    with pytest.raises(
        BackendUnavailableError, match=r"cluster backend needs kubernetes.*pip install 'pytest-devplug\[cluster\]'"
    ):
        create_backend("cluster", BackendOptions())


def test_sim_runs_never_import_the_kind_backend(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_one="""
        import sys
        def test_counts(devplug_node):
            assert devplug_node.name
            assert not [m for m in sys.modules if m.startswith(
                ("pytest_devplug.backends.kind", "kubernetes", "pykube"))]
        """
    )
    pytester.runpytest_subprocess("-p", "no:pytest-kind-ng").assert_outcomes(passed=1)
