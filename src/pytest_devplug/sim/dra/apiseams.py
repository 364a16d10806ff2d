"""The kubelet's DRA calls to the API server (``resource.k8s.io/v1``): the seams ``manager`` and ``plugins`` leave open.

:class:`KubeletDRAApi` is a :class:`~pytest_devplug.sim.dra.manager.ClaimSource` (``ResourceClaims(ns).Get``)
and a :class:`~pytest_devplug.sim.dra.plugins.ResourceSliceWiper` (``ResourceSlices().DeleteCollection`` by
field selector ``spec.nodeName`` [+ ``spec.driver``], as ``dra_plugin_manager.go`` wipes them).
"""

from __future__ import annotations

from typing import Any

from ...kuberest import KubeRest

__all__ = ["RESOURCE_API", "KubeletDRAApi"]

#: The group/version the kubelet of 1.34 reads.
RESOURCE_API = "/apis/resource.k8s.io/v1"


class KubeletDRAApi:
    """One node's kubelet talking to the API server about claims and slices."""

    def __init__(self, rest: KubeRest) -> None:
        self._rest = rest

    def get_resource_claim(self, namespace: str, name: str) -> dict[str, Any]:
        """The claim as the API server has it now; raises ``RestError`` with its message (``... not found``)."""
        return self._rest.get(f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims/{name}")

    def delete_resource_slices(self, node_name: str, driver: str | None) -> None:
        selector = f"spec.nodeName={node_name}" + (f",spec.driver={driver}" if driver else "")
        self._rest.delete(f"{RESOURCE_API}/resourceslices", fieldSelector=selector)
