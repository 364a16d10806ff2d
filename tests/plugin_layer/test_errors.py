"""One error root: every public exception is a ``DevplugError`` defined in ``pytest_devplug.errors`` and still
importable from where it lived before; "not found" is a type, never a message test."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import pytest_devplug
from pytest_devplug import PodHandle, errors

SRC = Path(pytest_devplug.__file__).parent


def _public_exceptions() -> list[type[BaseException]]:
    objs = (getattr(pytest_devplug, n) for n in pytest_devplug.__all__)
    return [o for o in objs if isinstance(o, type) and issubclass(o, BaseException)]


@pytest.mark.parametrize("exc", _public_exceptions(), ids=lambda e: e.__name__)
def test_public_exception_is_a_devplug_error_from_the_errors_module(exc: type[BaseException]) -> None:
    assert issubclass(exc, errors.DevplugError)
    assert exc.__module__ == "pytest_devplug.errors"


@pytest.mark.parametrize(
    "module, name",
    [
        ("pytest_devplug.backends.base", "BackendError"),
        ("pytest_devplug.backends.base", "ObjectNotFoundError"),
        ("pytest_devplug.backends.base", "PodRejectedError"),
        ("pytest_devplug.waiting", "WaitTimeout"),
        ("pytest_devplug.faults", "FaultNotSupportedError"),
        ("pytest_devplug.handles", "MockControlsUnavailableError"),
        ("pytest_devplug.evidence", "DevplugAssertionError"),
        ("pytest_devplug.nvml", "MockBuildError"),
        ("pytest_devplug.sim.errors", "SimError"),
        ("pytest_devplug.kubeletmodel.checkpoint", "CheckpointError"),
        ("pytest_devplug.nvml.probe", "NvmlError"),
        ("pytest_devplug.controlplane.errors", "ControlPlaneError"),
    ],
)
def test_old_import_paths_still_work_and_share_the_root(module: str, name: str) -> None:
    exc = getattr(__import__(module, fromlist=[name]), name)
    assert issubclass(exc, errors.DevplugError)


def test_compatible_builtin_bases_are_kept() -> None:
    """Callers that caught the old bases keep working."""
    assert issubclass(errors.FaultNotSupportedError, NotImplementedError)
    assert issubclass(errors.MockControlsUnavailableError, RuntimeError)
    assert issubclass(errors.MockBuildError, RuntimeError)
    assert issubclass(errors.DevplugAssertionError, AssertionError)
    assert issubclass(errors.ContainerStatusMissingError, KeyError)


def test_a_container_without_status_yet_is_a_type_with_a_plain_message() -> None:
    class Backend:
        def get_pod(self, name: str, namespace: str) -> dict[str, object]:
            return {"metadata": {"name": name}, "status": {"phase": "Pending"}}

    pod = PodHandle(Backend(), "p", "ns", container="c", resource_name="nvidia.com/gpu", timeout=1.0)  # type: ignore[arg-type]
    with pytest.raises(errors.ContainerStatusMissingError) as info:
        pod.container_status()
    assert str(info.value) == "pod ns/p has no status for container 'c' yet"


def test_no_code_tells_not_found_by_its_message() -> None:
    pattern = re.compile(r"""["']not found["']\s+(not\s+)?in\b""", re.I)
    hits = [f"{p.relative_to(SRC)}:{n}" for p in SRC.rglob("*.py") for n, line in
            enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]  # fmt: skip
    assert hits == []


def test_old_sim_view_names_are_deprecated_aliases() -> None:
    from pytest_devplug.kubeletmodel import views
    from pytest_devplug.sim import model

    assert (model.ContainerSpec, model.PodSpecView) == (views.ContainerSpec, views.PodSpecView)
    for old, new in (("MountSpec", views.MountView), ("DeviceNodeSpec", views.DeviceNodeView),
                     ("ContainerRuntimeOptions", views.ContainerView)):  # fmt: skip
        with pytest.warns(DeprecationWarning, match=f"use pytest_devplug.kubeletmodel.views.{new.__name__}"):
            assert getattr(model, old) is new
    with pytest.raises(AttributeError):
        model.Nope  # noqa: B018
