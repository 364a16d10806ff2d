"""The Kubernetes REST API as JSON dicts over a ``kubernetes.client.ApiClient``, for any API group.

The typed client's model classes come and go with its versions (``ResourceV1Api`` exists from 34.1 on, the
project supports 30+), and its models refuse what the API server itself should judge. Requests here are
built from paths, bodies are sent as they are and answers decoded as the API server sent them (camelCase
keys), so the embedded kubelet's DRA side and the DRA fixtures read ``resource.k8s.io/v1`` with any client
version. Refusals raise :class:`RestError` carrying the API server's status, reason and message.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .errors import DevplugError

__all__ = ["KubeRest", "RestError", "MERGE_PATCH", "STRATEGIC_PATCH"]

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"


class RestError(DevplugError):
    """The API server refused a request; ``str()`` is its own message (e.g. ``resourceclaims.resource.k8s.io "x"
    not found``), as client-go's error reads."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def not_found(self) -> bool:
        return self.status == 404


def _error(exc: Any) -> RestError:
    try:
        body = json.loads(getattr(exc, "body", None) or "{}")
    except ValueError:
        body = {}
    status = int(getattr(exc, "status", 0) or 0)
    reason = str(body.get("reason") or getattr(exc, "reason", "") or "")
    return RestError(status, reason, str(body.get("message") or getattr(exc, "body", None) or reason or exc))


class KubeRest:
    """Requests by path (``/apis/resource.k8s.io/v1/resourceslices``) through ``client``; ``timeout`` bounds each."""

    def __init__(self, client: Any, timeout: float) -> None:
        self.client = client
        self.timeout = timeout

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        """One request; the decoded answer (``{}`` for an empty one). Raises :class:`RestError` for any status >= 300
        and for a connection that fails (status 0)."""
        from kubernetes.client import ApiException

        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        try:
            m, url, hdrs, data, _ = self.client.param_serialize(
                method, path, header_params=headers, body=body, query_params=list((query or {}).items()),
                auth_settings=["BearerToken"],  # a token kubeconfig's; client certificates need none
            )
            resp = self.client.call_api(m, url, header_params=hdrs, body=data, _request_timeout=self.timeout)
            raw = resp.read()
        except ApiException as exc:
            raise _error(exc) from None
        except Exception as exc:  # noqa: BLE001 - urllib3's connection errors, as client-go's "connection refused"
            raise RestError(0, "ConnectionError", f"{method} {path}: {exc}") from None
        if not 200 <= int(resp.status) < 300:
            raise _error(ApiException(http_resp=resp))
        return dict(json.loads(raw)) if raw else {}

    def get(self, path: str, **query: str) -> dict[str, Any]:
        return self.request("GET", path, query=query)

    def items(self, path: str, **query: str) -> list[dict[str, Any]]:
        """A list request's ``items``."""
        return list(self.get(path, **query).get("items") or [])

    def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return self.request("POST", path, body=dict(body))

    def delete(self, path: str, **query: str) -> dict[str, Any]:
        return self.request("DELETE", path, query=query)

    def patch(self, path: str, body: Mapping[str, Any], *, content_type: str = MERGE_PATCH) -> dict[str, Any]:
        return self.request("PATCH", path, body=dict(body), content_type=content_type)
