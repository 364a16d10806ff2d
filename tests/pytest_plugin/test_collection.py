"""Test folders are packages: any subset of them collects together (no two ``conftest``/helper modules clash,
no ``from conftest import``), so ``pytest tests/sim tests/differential tests/gpu_plugin`` works as one run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
FOLDERS = sorted(p.name for p in TESTS.iterdir() if p.is_dir() and any(p.glob("test_*.py")))


def test_every_test_folder_is_a_package() -> None:
    assert (TESTS / "__init__.py").exists()
    assert [f for f in FOLDERS if not (TESTS / f / "__init__.py").exists()] == []


def test_no_test_module_imports_conftest() -> None:
    pattern = re.compile(r"^\s*(from\s+\.*conftest\s+import|import\s+conftest)\b", re.M)
    assert [str(p.relative_to(TESTS)) for p in TESTS.rglob("*.py") if pattern.search(p.read_text())] == []


def test_all_folders_collect_together() -> None:
    assert {"sim", "differential", "gpu_plugin"} <= set(FOLDERS)
    # The differentials' file first: it once failed when collected beside tests/sim (two modules named conftest).
    folders = [
        "differential",
        "sim",
        "gpu_plugin",
        *[f for f in FOLDERS if f not in ("differential", "sim", "gpu_plugin")],
    ]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            *(f"tests/{f}" for f in folders),
        ],
        cwd=TESTS.parent,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert re.search(r"^\d+ tests? collected", out, re.M), out[-2000:]
    assert "error" not in out.splitlines()[-1].lower(), out[-2000:]
