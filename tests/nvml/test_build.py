"""The mock library's build: cached by source hash, built once under a lock, clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_devplug.backends import mockstate
from pytest_devplug.nvml import build
from pytest_devplug.errors import CompilerNotFoundError, MockBuildError


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DEVPLUG_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_built_once_into_the_cache_keyed_by_source(cache: Path) -> None:
    lib = build.mock_library()
    assert lib.name == "libnvidia-ml.so.1"
    assert lib.parent.parent == cache / "nvml"
    mtime = lib.stat().st_mtime_ns
    assert build.mock_library() == lib and lib.stat().st_mtime_ns == mtime, "a cached build was rebuilt"
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True).stdout
    exported = {line.split()[-1] for line in symbols.splitlines() if " T " in line}
    assert {
        "nvmlInit_v2",
        "nvmlDeviceGetCount_v2",
        "nvmlDeviceGetHandleByIndex_v2",
        "nvmlEventSetWait_v2",
        "nvmlDeviceGetPciInfo_v3",
    } <= exported
    assert all(name.startswith("nvml") for name in exported), f"internal symbols leak out: {exported}"


def test_cache_dir_follows_xdg_when_not_set(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("DEVPLUG_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert build.cache_root() == tmp_path / "pytest-devplug"


def test_missing_compiler_is_named(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "/nonexistent/cc")
    with pytest.raises(CompilerNotFoundError, match=r"no C compiler found \(tried \$CC='/nonexistent/cc'"):
        build.mock_library()
    monkeypatch.delenv("CC")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(CompilerNotFoundError, match="tried cc, gcc, clang on PATH.*apt-get install gcc"):
        build.mock_library()


def test_compiler_failure_carries_its_output(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "cc -include /nonexistent/header.h")
    with pytest.raises(MockBuildError, match="building the mock libnvidia-ml.so.1 failed.*nonexistent/header.h"):
        build.mock_library()


def test_probe_command_reports_the_mock(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    state.write_text(json.dumps(mockstate.initial_state(2, 2)))
    out = subprocess.run(
        [sys.executable, "-m", "pytest_devplug.cli", "nvml", "probe", "--mock", str(state), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["system"]["driver version"] == "550.54.15"
    assert [d["uuid"] for d in report["devices"]] == [mockstate.gpu_uuid(0), mockstate.gpu_uuid(1)]
    assert [d["NUMA node"] for d in report["devices"]] == ["0", "1"]
    assert report["devices"][0]["memory MiB"] == "40960"
    assert report["devices"][1]["PCI bus id"] == "000010DE:00:01.0"  # the mock's PCI domain, none of the host's
    assert report["devices"][0]["events"] == "SingleBitEccError,DoubleBitEccError,XidCriticalError"
    assert report["devices"][0]["MIG mode"] == "n/a (Not Supported)"


def test_probe_command_on_a_missing_library_says_so(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pytest_devplug.cli", "nvml", "probe", "--lib", str(tmp_path / "libnvidia-ml.so.1")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert "cannot load" in out.stderr and "libnvidia-ml.so.1" in out.stderr
