"""Publishable, and working from a wheel: ``python -m build`` makes sdist and wheel of both distributions,
``twine check`` passes, the wheel holds what the suite needs, and a fresh venv with an older gRPC and protobuf
pinned (as a plugin project would) installs the wheels and passes the conformance suite from an empty directory.

Slow-ish (two builds, one venv; warm uv cache: about a minute), so one test does it all in order.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from .dist_helpers import ROOT, Dists, lowest_python, run

#: What a plugin project pinned to older releases would have (well below the newest, above the floors).
OLD_PINS = ("grpcio==1.62.3", "protobuf==4.25.3")


def test_build_check_install_and_run_the_suite_from_the_wheel(tmp_path: Path, uv: str, dists: Dists) -> None:
    wheel, sdist, plugin_wheel, plugin_sdist = dists.wheel, dists.sdist, dists.plugin_wheel, dists.plugin_sdist
    run([sys.executable, "-m", "twine", "check", "--strict", *map(str, (wheel, sdist, plugin_wheel, plugin_sdist))])

    names = set(zipfile.ZipFile(wheel).namelist())
    # Every file of the package ships: the suite, py.typed, data such as the mock NVML's C sources.
    src = ROOT / "src"
    tracked = run(["git", "-C", str(ROOT), "ls-files", "src/pytest_devplug"]).split()
    package = {str((ROOT / t).relative_to(src)) for t in tracked} or {
        str(p.relative_to(src))
        for p in (src / "pytest_devplug").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert {"pytest_devplug/py.typed", "pytest_devplug/conformance/test_registration.py"} <= package
    assert not package - names, f"missing from {wheel.name}: {sorted(package - names)}"
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), sorted(n for n in names if "dist-info" in n)
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    for line in (
        "License-Expression: Apache-2.0",
        "Requires-Python: >=3.10",
        "Provides-Extra: gpu-plugin",
        "Provides-Extra: kind",
        "Classifier: Programming Language :: Python :: 3.13",
        "Project-URL: ",
    ):
        assert line in meta, line
    assert any(n.endswith("licenses/LICENSE") for n in zipfile.ZipFile(plugin_wheel).namelist())

    venv = tmp_path / "venv"
    run([uv, "venv", "-q", "-p", lowest_python(), str(venv)])
    py = str(venv / "bin" / "python")
    run([uv, "pip", "install", "-q", "-p", py, f"{wheel}[gpu-plugin]", str(plugin_wheel), *OLD_PINS], timeout=900)
    versions = run([py, "-c", "import grpc, google.protobuf as p; print(grpc.__version__, p.__version__)"]).split()
    assert versions == [pin.split("==")[1] for pin in OLD_PINS]

    empty = tmp_path / "empty"
    empty.mkdir()
    bin_ = venv / "bin"
    run([str(bin_ / "devplug"), "conformance", "--report", "report.md", "--", "-q"], cwd=empty, timeout=900)
    report = json.loads((empty / "report.json").read_text())
    assert report["run"]["backend"] == "sim" and report["summary"].get("passed", 0) > 0
    assert not {"failed", "error"} & set(report["summary"]), report["summary"]

    # The control-plane build ships in the wheel: it runs from the installed package, no checkout (the default
    # release, which `nox -s tests` builds first: cached, so instant here; a cold one builds the same way).
    built = run([str(bin_ / "devplug"), "control-plane", "build"], cwd=empty, timeout=1800)
    assert "kube-apiserver: " in built and "etcd: " in built, built

    # Without the kind extra: its options still exist (ours), and choosing kind names the extra at once.
    help_text = run([str(bin_ / "pytest"), "--help"], cwd=empty)
    for option in (
        "--cluster-name",
        "--keep-cluster",
        "--kind-bin",
        "--kind-image",
        "--kubeconfig",
        "--devplug-report",
    ):
        assert option in help_text, option
    kind = subprocess.run(
        [str(bin_ / "devplug"), "conformance", "--backend", "kind", "--", "-q"],
        cwd=empty,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert kind.returncode == pytest.ExitCode.USAGE_ERROR, kind.stdout + kind.stderr
    assert "pip install 'pytest-devplug[kind]'" in kind.stdout + kind.stderr

    # Without the included plugin and no plugin option: at once, what to install or pass.
    run([uv, "pip", "uninstall", "-q", "-p", py, "devplug-gpu-plugin"])
    bare = subprocess.run(
        [str(bin_ / "devplug"), "conformance"], cwd=empty, capture_output=True, text=True, timeout=60, check=False
    )
    assert bare.returncode == pytest.ExitCode.USAGE_ERROR
    assert "pip install 'pytest-devplug[gpu-plugin]'" in bare.stderr and "--plugin-cmd" in bare.stderr

    # The plain install reads CDI specs in YAML, as NIC plugins write them (no extra needed).
    (empty / "widget.yaml").write_text(
        "cdiVersion: 0.6.0\nkind: example.com/widget\ndevices:\n- name: w0\n  containerEdits:\n    env: [WIDGET=0]\n"
    )
    edits = run(
        [
            py,
            "-c",
            "import pathlib; from pytest_devplug.kubeletmodel import cdi; "
            "print(cdi.resolve(['example.com/widget=w0'], [pathlib.Path('.')]).env)",
        ],
        cwd=empty,
    )
    assert edits.strip() == "{'WIDGET': '0'}", edits
