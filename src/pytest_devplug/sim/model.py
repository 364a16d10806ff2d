"""Old import path of the device manager's pod view, now :mod:`pytest_devplug.kubeletmodel.views`.

``MountSpec``, ``DeviceNodeSpec`` and ``ContainerRuntimeOptions`` were the sim's twins of the view types; they are
deprecated aliases of ``MountView``, ``DeviceNodeView`` and ``ContainerView`` (frozen: its lists are tuples).
"""

from __future__ import annotations

import warnings

from ..kubeletmodel.views import ContainerSpec, ContainerView, DeviceNodeView, MountView, PodSpecView

__all__ = ["ContainerSpec", "PodSpecView"]

_DEPRECATED: dict[str, type] = {"MountSpec": MountView, "DeviceNodeSpec": DeviceNodeView, "ContainerRuntimeOptions": ContainerView}


def __getattr__(name: str) -> type:
    new = _DEPRECATED.get(name)
    if new is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"pytest_devplug.sim.model.{name} is deprecated; use pytest_devplug.kubeletmodel.views.{new.__name__}",
        DeprecationWarning,
        stacklevel=2,
    )
    return new
