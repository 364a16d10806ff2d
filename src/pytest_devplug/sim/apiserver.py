"""What kube-apiserver does to a pod on create: decoding, defaulting and validation.

Only the rules a device-plugin test can trip over are reproduced, with upstream's texts and field
paths (``pkg/apis/core/validation``: ``ValidateContainerResourceRequirements``,
``ValidateResourceQuantityValue``; ``pkg/apis/core/v1/defaults.go``: ``SetDefaults_Pod``), so that a
spec rejected here is rejected the same way by a real API server, and one accepted here runs on kind.
"""

from __future__ import annotations

import json

import copy
import secrets
import string
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Mapping

from ..kubeletmodel.quantity import QUANTITY_REGEX_TEXT, Quantity, parse_quantity
from ..errors import ApiError, QuantityError
from .names import (
    dns1123_subdomain_errors,
    go_quote,
    is_extended_resource_name,
    resource_name_errors,
)

__all__ = [
    "Quantity",
    "parse_quantity",
    "decode_quantity",
    "is_extended_resource",
    "to_manifest",
    "default_pod",
    "validate_pod",
    "admit_pod",
    "now_rfc3339",
    "FieldError",
]


def _bad_quantity() -> ApiError:
    return ApiError(
        400,
        "BadRequest",
        'Pod in version "v1" cannot be handled as a Pod: quantities must match the regular expression '
        f"'{QUANTITY_REGEX_TEXT}'",
    )


def decode_quantity(raw: object) -> Quantity:
    """A quantity of a pod's JSON as the API server decodes it: one that does not parse is a 400."""
    try:
        return parse_quantity(raw)
    except QuantityError:
        raise _bad_quantity() from None


def is_extended_resource(name: str) -> bool:
    """``IsExtendedResourceName``: a qualified, domain-prefixed name outside ``kubernetes.io``."""
    return is_extended_resource_name(name)


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def to_manifest(obj: object) -> dict[str, Any]:
    """A plain Kubernetes dict from a dict or a ``kubernetes.client`` model (``V1Pod``)."""
    if isinstance(obj, Mapping):
        return copy.deepcopy(dict(obj))
    if hasattr(obj, "openapi_types") and hasattr(obj, "attribute_map"):
        from kubernetes.client import ApiClient  # imported lazily: heavy, and only needed for models

        data = ApiClient().sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]
        if isinstance(data, dict):
            return data
    raise ApiError(400, "BadRequest", f"cannot handle {type(obj).__name__} as a Pod manifest")


@dataclass(frozen=True)
class FieldError:
    """One ``field.Error``: rendered exactly like apimachinery's ``Error()``."""

    path: str
    kind: str  # "Invalid" | "Required" | "Forbidden"
    value: object
    detail: str

    def __str__(self) -> str:
        if self.kind == "Required":
            body = "Required value"
        elif self.kind == "Forbidden":
            body = "Forbidden"
        elif isinstance(self.value, (bool, int, float)):  # ErrorBody: simple types with %v
            body = f"Invalid value: {str(self.value).lower() if isinstance(self.value, bool) else self.value}"
        elif isinstance(self.value, str):  # %q
            body = f"Invalid value: {go_quote(self.value)}"
        else:
            # strings with %q; anything else as its JSON: a resource.Quantity marshals to a JSON string,
            # so `Invalid value: "500m"` (seen on a real 1.34 API server), quoted like a string.
            body = f"Invalid value: {json.dumps(str(self.value))}"
        return f"{self.path}: {body}: {self.detail}" if self.detail else f"{self.path}: {body}"


def _containers(spec: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    for key in ("containers", "initContainers"):
        for i, c in enumerate(spec.get(key) or []):
            out.append((f"spec.{key}[{i}]", c))
    return out


def default_pod(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """Server-side defaulting: identity fields, ``SetDefaults_Pod`` (limits copied into missing
    requests, per resource) and the few spec defaults that tests read back."""
    pod = copy.deepcopy(dict(manifest))
    pod.setdefault("apiVersion", "v1")
    pod.setdefault("kind", "Pod")
    meta = pod.setdefault("metadata", {})
    if not meta.get("name") and meta.get("generateName"):
        suffix = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(5))
        meta["name"] = f"{meta['generateName']}{suffix}"
    meta["namespace"] = meta.get("namespace") or "default"
    meta["uid"] = str(uuid.uuid4())
    meta["creationTimestamp"] = now_rfc3339()
    meta.setdefault("resourceVersion", "1")
    spec = pod.setdefault("spec", {})
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("priority", 0)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    for _, c in _containers(spec):
        res = c.get("resources")
        if not isinstance(res, dict):
            continue
        limits = res.get("limits")
        if limits:
            requests = res.setdefault("requests", {}) or {}
            res["requests"] = requests
            for k, v in limits.items():
                requests.setdefault(k, v)
    return pod


def _validate_resources(path: str, res: Mapping[str, Any], errs: list[FieldError]) -> None:
    limits = res.get("limits") or {}
    requests = res.get("requests") or {}
    lim_path, req_path = f"{path}.resources.limits", f"{path}.resources.requests"
    parsed_limits: dict[str, Quantity] = {}
    for name in sorted(limits):
        q = decode_quantity(limits[name])
        parsed_limits[name] = q
        _validate_name_and_value(name, q, f"{lim_path}[{name}]", errs)
    for name in sorted(requests):
        q = decode_quantity(requests[name])
        _validate_name_and_value(name, q, f"{req_path}[{name}]", errs)
        overcommit_allowed = not is_extended_resource(name) and not name.startswith("hugepages-")
        lim = parsed_limits.get(name)
        if lim is not None:
            if q.value != lim.value and not overcommit_allowed:
                errs.append(FieldError(req_path, "Invalid", str(q), f"must be equal to {name} limit of {lim}"))
            elif q.value > lim.value:
                errs.append(
                    FieldError(req_path, "Invalid", str(q), f"must be less than or equal to {name} limit of {lim}")
                )
        elif not overcommit_allowed:
            errs.append(FieldError(lim_path, "Required", "", "Limit must be set for non overcommitable resources"))


def _validate_name_and_value(name: str, q: Quantity, path: str, errs: list[FieldError]) -> None:
    errs.extend(FieldError(path, "Invalid", name, msg) for msg in resource_name_errors(name))
    if q.value < 0:
        errs.append(FieldError(path, "Invalid", str(q), "must be greater than or equal to 0"))
    if is_extended_resource(name) and not q.is_integer():
        errs.append(FieldError(path, "Invalid", q, "must be an integer"))


def validate_pod(pod: Mapping[str, Any]) -> list[FieldError]:
    """The create-time validation errors of a defaulted pod, in upstream's order."""
    errs: list[FieldError] = []
    meta = pod.get("metadata") or {}
    name = meta.get("name") or ""
    if not name:
        errs.append(FieldError("metadata.name", "Required", "", "name or generateName is required"))
    else:
        errs.extend(FieldError("metadata.name", "Invalid", name, msg) for msg in dns1123_subdomain_errors(name))
    spec = pod.get("spec") or {}
    if not spec.get("containers"):
        errs.append(FieldError("spec.containers", "Required", "", ""))
    for path, c in _containers(spec):
        if not c.get("name"):
            errs.append(FieldError(f"{path}.name", "Required", "", ""))
        if not c.get("image"):
            errs.append(FieldError(f"{path}.image", "Required", "", ""))
        res = c.get("resources")
        if isinstance(res, Mapping):
            _validate_resources(path, res, errs)
    return errs


def admit_pod(manifest: object) -> dict[str, Any]:
    """Decode, default and validate a pod as ``POST /api/v1/namespaces/{ns}/pods`` would.

    Raises ``ApiError(422, "Invalid", 'Pod "x" is invalid: ...')`` (several errors are joined as
    ``[a, b]``, duplicates dropped, like ``ErrorList.ToAggregate``) or ``ApiError(400, ...)``.
    """
    pod = default_pod(to_manifest(manifest))
    errs = validate_pod(pod)
    if errs:
        seen: list[str] = []
        for e in errs:
            if str(e) not in seen:
                seen.append(str(e))
        agg = seen[0] if len(seen) == 1 else "[" + ", ".join(seen) + "]"
        name = (pod.get("metadata") or {}).get("name") or ""
        raise ApiError(422, "Invalid", f"Pod {go_quote(name)} is invalid: {agg}")
    # Quantities are stored in canonical form, as the API server re-serializes them.
    for _, c in _containers(pod["spec"]):
        res = c.get("resources")
        if isinstance(res, dict):
            for key in ("limits", "requests"):
                if res.get(key):
                    res[key] = {k: str(decode_quantity(v)) for k, v in res[key].items()}
    return pod
