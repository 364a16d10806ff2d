"""What the differential tests and their fixtures share: one side of a comparison, the replica count."""

from __future__ import annotations

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
