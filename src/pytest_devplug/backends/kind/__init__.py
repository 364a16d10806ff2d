"""The ``kind`` backend: the backend protocol on a real kind cluster, one responsibility per module.

- ``lifecycle``: kind binary and node image choice (standard vs offline), create/reuse/recreate, readiness,
  teardown (:class:`~.lifecycle.ClusterManager`, on pytest-kind-ng's ``KindCluster``).
- ``deploy``: the plugin image (built for the included plugin).
- ``transport``: the node transport, ``docker exec`` into a node container.
- ``proc``: running ``kind`` and ``docker`` with bounded time and readable errors.
- ``backend``: :class:`KindProvider`, the kind part of :class:`~..k8s.backend.KubeBackend` (:func:`kind_backend`).
"""

from __future__ import annotations

from .backend import KindProvider, kind_backend

__all__ = ["KindProvider", "kind_backend"]
