"""The ``kind`` backend: the backend protocol on a real kind cluster, one responsibility per module.

- ``cluster``: kind binary and node image choice (standard vs offline), create/reuse/recreate, readiness, teardown
  (on pytest-kind-ng's ``KindCluster``).
- ``deploy``: the plugin image (built for the included plugin) and its DaemonSet.
- ``node``: node-container operations (kubelet restart and journal, checkpoint, files, pod-resources).
- ``api``: the Kubernetes API calls, JSON in and out.
- ``backend``: :class:`KindBackend`, the protocol on top of those.
"""

from __future__ import annotations

from .backend import KindBackend

__all__ = ["KindBackend"]
