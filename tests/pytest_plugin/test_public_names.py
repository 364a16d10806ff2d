"""A project written against 0.1.0 keeps importing: every public name of that release still imports, or importing
it says what replaced it.

``PUBLIC_0_1_0`` is every name ``pytest_devplug.__all__`` and ``pytest_devplug.dra.__all__`` have held while the
version was 0.1.0 (collected from the git history of both ``__init__.py``; the docs told users to import nothing
else from these two packages), each with its successor where it no longer imports: a renamed name
(``pytest_devplug._renames.RENAMED``) still works with a ``DeprecationWarning`` naming the successor, a removed one
(``REMOVED``) raises an ``ImportError`` naming itself and the successor. A name added to an ``__all__`` since goes in
``NEW_SINCE_0_1_0``, so neither list can go stale silently; ``CHANGELOG.md`` names every renamed and removed one.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import pytest_devplug
from pytest_devplug import _renames

ROOT = Path(__file__).resolve().parents[2]

#: package -> public name of 0.1.0 -> its successor (``None``: the name itself still imports).
PUBLIC_0_1_0: dict[str, dict[str, str | None]] = {
    "pytest_devplug": {
        # assertions
        "assert_allocatable": None,
        "assert_allocate_injections": None,
        "assert_checkpoint_survives_kubelet_restart": None,
        "assert_devices_unhealthy": None,
        "assert_gpu_limit_rules": "assert_limit_rules",
        "assert_limit_rules": None,
        "assert_registered": None,
        "assert_reregisters_after_kubelet_restart": None,
        # backend data types
        "Checkpoint": None,
        "CheckpointEntry": None,
        "ContainerView": None,
        "DeviceNodeView": None,
        "ExecResult": None,
        "MountView": None,
        "NodeSpec": None,
        "PluginSpec": None,
        "PodResourcesContainer": None,
        "PodResourcesDevices": None,
        "PodResourcesPod": None,
        # errors
        "BackendError": None,
        "BackendUnavailableError": None,
        "ContainerStatusMissingError": None,
        "DevplugAssertionError": None,
        "DevplugError": None,
        "FaultNotSupportedError": None,
        "MockControlsUnavailableError": None,
        "ObjectNotFoundError": None,
        "PodRejectedError": None,
        "UnsupportedOperationError": None,
        "WaitAbandoned": None,
        "WaitTimeout": None,
        # faults
        "FaultInjector": None,
        "MockNvmlFaults": None,
        "NvmlXidFaults": None,
        # handles
        "ClusterHandle": None,
        "MockNvml": None,
        "NodeHandle": None,
        "PluginHandle": None,
        "PodFactory": None,
        "PodHandle": None,
        # waiting
        "wait_for": None,
    },
    "pytest_devplug.dra": {
        "DRACallRecord": None,
        "DriverSpec": None,
        "RegistrationRecord": None,
        "assert_claim_prepared": None,
        "assert_dra_checkpoint_survives_kubelet_restart": None,
        "assert_driver_registered": None,
        "assert_driver_reregisters_after_kubelet_restart": None,
        "assert_slices_published": None,
        "DRAFaultInjector": None,
        "DRAMockNvmlFaults": None,
        "DRANvmlXidFaults": None,
        "ClaimFactory": None,
        "ClaimHandle": None,
        "ClaimPodHandle": None,
        "DRANodeHandle": None,
        "DriverHandle": None,
        "AllocatedDevice": None,
        "DRACheckpoint": None,
        "PreparedClaim": None,
        "PreparedDevice": None,
        "SliceView": None,
    },
}

#: Names public since 0.1.0 (in an ``__all__`` today, not in ``PUBLIC_0_1_0``).
NEW_SINCE_0_1_0: dict[str, set[str]] = {"pytest_devplug": set(), "pytest_devplug.dra": set()}

CASES = [(package, name, new) for package, names in PUBLIC_0_1_0.items() for name, new in names.items()]


def _from_import(package: str, name: str) -> object:
    """``from package import name``, as a user's module writes it."""
    namespace: dict[str, object] = {}
    exec(f"from {package} import {name}", namespace)
    return namespace[name]


def _check_successor(package: str, name: str, new: str) -> None:
    """``name`` either works as ``new`` with a DeprecationWarning naming both, or raises an ImportError naming both."""
    module = importlib.import_module(package)
    assert new in module.__all__, f"{package}.{name}'s successor {new} is not public"
    if package == "pytest_devplug" and name in _renames.RENAMED:
        assert _renames.RENAMED[name][0] == new
        for get in (lambda: _from_import(package, name), lambda: getattr(module, name)):
            with pytest.warns(DeprecationWarning) as record:
                assert get() is getattr(module, new)
            assert all(name in str(w.message) and new in str(w.message) for w in record)
        return
    for get in (lambda: _from_import(package, name), lambda: getattr(module, name)):
        with pytest.raises(ImportError) as info:
            get()
        assert name in str(info.value) and new in str(info.value), f"{package}.{name}: {info.value}"


@pytest.mark.parametrize(("package", "name", "new"), CASES, ids=[f"{p}.{n}" for p, n, _ in CASES])
def test_each_name_of_0_1_0_imports_or_names_its_successor(package: str, name: str, new: str | None) -> None:
    if new is not None:
        _check_successor(package, name, new)
        return
    module = importlib.import_module(package)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _from_import(package, name) is getattr(module, name)
    assert name in module.__all__


@pytest.mark.parametrize("package", sorted(PUBLIC_0_1_0))
def test_every_public_name_is_of_0_1_0_or_listed_as_new(package: str) -> None:
    public = set(importlib.import_module(package).__all__)
    known = set(PUBLIC_0_1_0[package])
    new = NEW_SINCE_0_1_0[package]
    assert not public - known - new, (
        f"{package}.__all__ has {sorted(public - known - new)}: add them to NEW_SINCE_0_1_0 (or, renamed from a "
        "name of 0.1.0, give that name its successor in PUBLIC_0_1_0)"
    )
    assert new <= public and not new & known, f"NEW_SINCE_0_1_0[{package!r}] is stale: {sorted(new)}"


def test_the_rename_tables_are_the_names_with_a_successor() -> None:
    """A name put in RENAMED or REMOVED is one of 0.1.0 with a successor here, and the other way round."""
    with_successor = {name for name, new in PUBLIC_0_1_0["pytest_devplug"].items() if new is not None}
    assert set(_renames.RENAMED) | set(_renames.REMOVED) == with_successor
    assert not set(_renames.RENAMED) & set(_renames.REMOVED)
    assert all(new is None for new in PUBLIC_0_1_0["pytest_devplug.dra"].values()), (
        "pytest_devplug.dra has no module __getattr__: a DRA name renamed or removed needs one like the root's"
    )


def test_the_changelog_names_each_renamed_or_removed_name_and_its_successor() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    unreleased = changelog.split("## [Unreleased]", 1)[1].split("\n## ", 1)[0]
    for package, names in PUBLIC_0_1_0.items():
        for name, new in names.items():
            if new is not None:
                for named in (name, new):  # in a code span, bare or dotted: `assert_limit_rules`, `pkg.name`
                    assert re.search(rf"`(?:[\w.]+\.)?{named}`", unreleased), f"CHANGELOG.md: {package}.{name}"


def test_a_renamed_name_works_with_a_warning_naming_its_successor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_renames, "RENAMED", {"assert_gpus_allocatable": ("assert_allocatable", "0.3.0")})
    with pytest.warns(DeprecationWarning) as record:
        from pytest_devplug import assert_gpus_allocatable  # type: ignore[attr-defined]
    assert assert_gpus_allocatable is pytest_devplug.assert_allocatable
    with pytest.warns(DeprecationWarning) as record_attr:
        assert pytest_devplug.assert_gpus_allocatable is pytest_devplug.assert_allocatable  # type: ignore[attr-defined]
    for w in [*record, *record_attr]:
        text = str(w.message)
        assert "assert_gpus_allocatable" in text and "assert_allocatable" in text and "0.3.0" in text, text
        assert w.filename == __file__, f"the warning points at {w.filename}:{w.lineno}, not the importing line"
    _check_successor("pytest_devplug", "assert_gpus_allocatable", "assert_allocatable")


def test_a_name_the_package_never_had_is_an_attribute_error() -> None:
    assert not hasattr(pytest_devplug, "assert_nothing")
    assert getattr(pytest_devplug, "assert_nothing", None) is None
    with pytest.raises(ImportError, match="cannot import name 'assert_nothing'"):
        _from_import("pytest_devplug", "assert_nothing")


def test_importing_the_package_warns_of_nothing() -> None:
    code = "import pytest_devplug, pytest_devplug.dra; from pytest_devplug import *; from pytest_devplug.dra import *"
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, check=False, timeout=120
    )
    assert result.returncode == 0 and not result.stderr, result.stderr


def test_the_removed_dirty_flag_names_mark_changed() -> None:
    """0.1.0's ``plugin.dirty = True`` raises instead of setting an attribute nothing reads."""
    from pytest_devplug import PluginHandle

    handle = PluginHandle.__new__(PluginHandle)  # no deployment needed: the property answers before any state
    with pytest.raises(AttributeError, match=r"mark_changed\(devices=True\)"):
        handle.dirty = True
    with pytest.raises(AttributeError, match="PluginHandle.dirty was removed"):
        _ = handle.dirty
