"""A real Kubernetes control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager) for tests.

``resolve()`` finds the binaries (:mod:`.binaries`), ``ControlPlane`` runs them (:mod:`.plane`). The sim
backend's ``--devplug-control-plane real`` puts the embedded kubelets under it as real Nodes; other code
(a DRA driver's tests) can use it directly. Depends on nothing above it; only on the harness's process
runner (:mod:`pytest_devplug.procs.process`) and the ``kubernetes`` client for :meth:`ControlPlane.client`.
"""

from __future__ import annotations

from .binaries import COMPONENTS, Binaries, resolve
from .plane import ControlPlane

__all__ = [
    "COMPONENTS",
    "Binaries",
    "ControlPlane",
    "resolve",
]
