"""What the differential tests and their fixtures share: one side of a comparison, the replica count."""

from __future__ import annotations

import os
from dataclasses import dataclass

from pytest_devplug import PluginHandle, PodFactory

#: The included plugin's time-slicing form: each GPU advertised twice (``<uuid>::0``, ``<uuid>::1``),
#: both IDs handing out the GPU's one ``/dev/nvidia<minor>``.
REPLICAS = 2


@dataclass
class Side:
    """One backend's view: its plugin (node, mock controls) and a pod factory on its GPU node."""

    name: str
    plugin: PluginHandle
    pods: PodFactory


def kind_required() -> bool:
    """``DEVPLUG_KIND_REQUIRED`` or ``CI`` set: a differential that cannot reach kind fails instead of skipping."""
    flags = (os.environ.get("DEVPLUG_KIND_REQUIRED", ""), os.environ.get("CI", ""))
    return any(f.strip().lower() not in ("", "0", "false", "no") for f in flags)
