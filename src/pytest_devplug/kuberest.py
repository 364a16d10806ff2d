"""The Kubernetes REST API as JSON dicts over a ``kubernetes.client.ApiClient``, for any API group.

The typed client changes shape between the releases the extras allow (30 and later): ``ResourceV1Api`` exists
from 34.1 on; 37 regenerated every API class (``_content_type`` and ``param_serialize`` came, the old
``call_api`` went) and turns a dict body into the operation's model before sending it, so a value the model
re-serialises differently is refused (a whole-second ``renewTime`` goes out as ``...05+00:00``, not a MicroTime).
Requests here are built from paths and sent on the client's own connection pool with its configuration (server,
TLS, bearer token): nothing of the generated code is used, bodies go out as they are and answers come back as
the API server sent them (camelCase keys), with any client release. Refusals raise :class:`RestError` carrying
the API server's status, reason and message.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from .errors import RestError

__all__ = ["KubeRest", "MERGE_PATCH", "STRATEGIC_PATCH"]

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"


def _error(status: int, http_reason: str, raw: bytes) -> RestError:
    """The API server's ``Status`` answer as an error; its reason or the HTTP one when the body is no Status."""
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    reason = str(body.get("reason") or http_reason)
    message = str(body.get("message") or raw.decode(errors="replace").strip() or reason or f"HTTP {status}")
    return RestError(status, reason, message, body.get("details") or {})


class KubeRest:
    """Requests by path (``/apis/resource.k8s.io/v1/resourceslices``) through ``client``; ``timeout`` bounds each."""

    def __init__(self, client: Any, timeout: float) -> None:
        self.client = client
        self.timeout = timeout

    def send(
        self, method: str, path: str, data: bytes | None = None, content_type: str = "application/json"
    ) -> tuple[int, str, bytes]:
        """One HTTP request of ``path`` (its query included) with ``data`` as the body: the status, its reason and the
        answer's body, whatever the status. Raises :class:`RestError` (status 0) when no answer came (connection
        refused, timeout, TLS)."""
        import urllib3

        config = self.client.configuration
        headers = {**self.client.default_headers, "Accept": "application/json"}
        for auth in config.auth_settings().values():  # the bearer token (a kubeconfig's, refreshed by its hook)
            if auth.get("in") == "header" and auth.get("value"):
                headers[auth["key"]] = auth["value"]
        if data is not None:
            headers["Content-Type"] = content_type
        try:
            resp = self.client.rest_client.pool_manager.urlopen(
                method,
                config.host.rstrip("/") + path,
                body=data,
                headers=headers,
                timeout=urllib3.Timeout(total=self.timeout),
                preload_content=True,
            )
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise RestError(0, "ConnectionError", f"{method} {path}: {exc}") from None
        return int(resp.status), str(resp.reason or ""), bytes(resp.data or b"")

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        """One request with ``body`` as JSON; the decoded answer (``{}`` for an empty one). Raises :class:`RestError`
        for any status >= 300 and for a connection that fails (status 0)."""
        target = path + (f"?{urlencode(list(query.items()))}" if query else "")
        data = None if body is None else json.dumps(body).encode()
        status, reason, raw = self.send(method, target, data, content_type)
        if not 200 <= status < 300:
            raise _error(status, reason, raw)
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
