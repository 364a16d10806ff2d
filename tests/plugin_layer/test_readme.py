"""The README agrees with ``pytest --help``, ``pytest --fixtures`` and the report: every option and fixture the
plugin has is documented, and the README names none that does not exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pytest_devplug.report import render_markdown

pytest_plugins = ["pytester"]

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
OPTION = re.compile(r"--devplug-[a-z][a-z-]*[a-z]")


def test_options_in_help_and_readme_are_the_same(pytester: pytest.Pytester) -> None:
    help_text = pytester.runpytest("--help").stdout.str()
    title = re.search(r"^(device-plugin end-to-end tests[^:\n]*):$", help_text, re.M)
    assert title is not None
    assert f'"{title.group(1)}"' in README, "README must name the option group as --help shows it"
    in_help, in_readme = set(OPTION.findall(help_text)), set(OPTION.findall(README))
    assert in_help - in_readme == set(), "options missing from the README"
    assert in_readme - in_help == set(), "README options that do not exist"
    for kind_option in ("--cluster-name", "--keep-cluster", "--kind-bin", "--kind-image", "--kubeconfig"):
        assert kind_option in help_text and kind_option in README


def test_fixtures_are_documented(pytester: pytest.Pytester) -> None:
    fixtures = set(re.findall(r"^(devplug_\w+)\b", pytester.runpytest("--fixtures").stdout.str(), re.M))
    assert {"devplug_cluster", "devplug_node", "devplug_plugin", "devplug_pod"} <= fixtures
    undocumented = {f for f in fixtures if f"`{f}`" not in README and f != "devplug_settings"}
    assert undocumented == set()


def test_report_example_has_the_rows_the_report_writes() -> None:
    example = [line.removeprefix("> ") for line in README.splitlines() if line.startswith("> |")]
    labels = {line.split("|")[1].strip() for line in example if line.count("|") == 3} - {""}
    data = {"run": {"plugin": "p", "resource": "r", "mock": False, "backend": "sim", "kubernetes": "k"},
            "pytest_devplug": "0", "pytest": "0", "started": "2026-12-01T00:00:00Z", "duration_s": 1.0,
            "interrupted": False, "summary": {"passed": 1}, "checks": []}  # fmt: skip
    written = {line.split("|")[1].strip() for line in render_markdown(data).splitlines() if line.count("|") == 3} - {""}
    assert labels and labels <= written, labels - written
    header = next(line for line in example if line.startswith("| check |"))
    assert header in render_markdown(dict(data, checks=[{"name": "a: t", "group": "core", "outcome": "passed",
                                                         "duration_s": 0.0, "reason": ""}]))  # fmt: skip
