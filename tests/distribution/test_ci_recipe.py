"""The CI recipe downstream projects copy (docs/github-actions.yml) works: its embedded-kubelet job's commands
run exactly as written, in a small plugin project with the module and resource the recipe names, with the
wheels built here standing in for PyPI (``PIP_FIND_LINKS``; nothing else changes).

Only the ``uses:`` steps (checkout, setup-python, upload-artifact) are GitHub's own and are not run; the test
checks that nothing else is left out.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
from pathlib import Path

import yaml
from .dist_helpers import ROOT, Dists, lowest_python, run

WORKFLOW = ROOT / "docs" / "github-actions.yml"
DOWNSTREAM = ROOT / "tests" / "pytest_plugin" / "test_downstream.py"


def _widget_plugin_source() -> str:
    """The downstream test's small device plugin (example.com/widget), as the plugin under test here."""
    spec = importlib.util.spec_from_file_location("_devplug_downstream_example", DOWNSTREAM)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    source: str = module.WIDGET_PLUGIN
    return source


def _plugin_project(where: Path, module: str) -> Path:
    pkg = where / module
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text(_widget_plugin_source())
    (where / "pyproject.toml").write_text(
        f'[build-system]\nrequires = ["setuptools>=69"]\nbuild-backend = "setuptools.build_meta"\n\n'
        f'[project]\nname = "{module.replace("_", "-")}"\nversion = "0.1.0"\n'
        f'dependencies = ["grpcio", "protobuf", "pytest-devplug"]\n'
    )
    return where


def test_embedded_kubelet_job_runs_as_written(tmp_path: Path, uv: str, dists: Dists) -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    env = {k: str(v) for k, v in workflow["env"].items()}
    job = workflow["jobs"]["embedded-kubelet"]
    steps = [s for s in job["steps"] if "run" in s]
    skipped = [s["uses"].split("@")[0] for s in job["steps"] if "run" not in s]
    assert skipped == ["actions/checkout", "actions/setup-python", "actions/upload-artifact"], skipped
    assert "kind" in workflow["jobs"] and "--backend kind" in " ".join(
        s.get("run", "") for s in workflow["jobs"]["kind"]["steps"]
    )

    # The recipe's example values name the plugin: `{python} -m <module> ...` and its resource.
    module = shlex.split(env["PLUGIN_CMD"])[2]
    project = _plugin_project(tmp_path / "project", module)
    venv = tmp_path / "venv"
    run([uv, "venv", "-q", "--seed", "-p", lowest_python(), str(venv)])
    summary = tmp_path / "step-summary.md"
    shell_env = dict(
        os.environ,
        **env,
        PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
        VIRTUAL_ENV=str(venv),
        PIP_FIND_LINKS=str(dists.dir),
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        GITHUB_STEP_SUMMARY=str(summary),
    )
    for step in steps:
        run(["bash", "-e", "-o", "pipefail", "-c", step["run"]], cwd=project, env=shell_env, timeout=900)

    report = json.loads((project / "devplug-report.json").read_text())
    assert report["run"]["resource"] == env["RESOURCE"] and f"-m {module}" in report["run"]["plugin"]
    assert report["summary"].get("passed", 0) > 0 and not {"failed", "error"} & set(report["summary"]), report[
        "summary"
    ]
    assert (project / "junit.xml").is_file()
    assert summary.read_text().startswith("# Device plugin conformance report")
