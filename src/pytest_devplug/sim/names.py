"""Kubernetes name rules with upstream's texts (apimachinery ``util/validation``, core ``helper``).

The API server, the kubelet's Registration service and node creation all judge names by these
rules; keeping them in one place keeps the embedded cluster from accepting a name that a real
cluster refuses (a resource name ending in a newline, an upper-case domain, a name of 300
characters), so a test cannot pass here and fail on kind.
"""

from __future__ import annotations

import re

__all__ = [
    "go_quote",
    "dns1123_subdomain_errors",
    "qualified_name_errors",
    "is_native_resource",
    "is_extended_resource_name",
    "resource_name_errors",
    "STANDARD_CONTAINER_RESOURCES",
]

DNS1123_SUBDOMAIN_MAX = 253
QUALIFIED_NAME_MAX = 63

_DNS1123_LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN_FMT = _DNS1123_LABEL_FMT + "(\\." + _DNS1123_LABEL_FMT + ")*"
_DNS1123_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character"
)
_QUALIFIED_NAME_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_QUALIFIED_NAME_MSG = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
)
# fullmatch, never match + "$": Python's "$" also matches before a final newline.
_DNS1123_SUBDOMAIN = re.compile(_DNS1123_SUBDOMAIN_FMT)
_QUALIFIED_NAME = re.compile(_QUALIFIED_NAME_FMT)

STANDARD_CONTAINER_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage"})
#: ``helper.standardResources``: the names without a domain that are resources at all.
_STANDARD_RESOURCES = STANDARD_CONTAINER_RESOURCES | {
    "requests.cpu",
    "requests.memory",
    "requests.ephemeral-storage",
    "requests.storage",
    "limits.cpu",
    "limits.memory",
    "limits.ephemeral-storage",
    "pods",
    "services",
    "replicationcontrollers",
    "resourcequotas",
    "secrets",
    "configmaps",
    "persistentvolumeclaims",
    "services.nodeports",
    "services.loadbalancers",
}


def _regex_error(msg: str, fmt: str, *examples: str) -> str:
    """``validation.RegexError``."""
    shown = " or ".join(f"'{e}', " for e in examples)
    return (
        f"{msg} (e.g. {shown}regex used for validation is '{fmt}')"
        if examples
        else f"{msg} (regex used for validation is '{fmt}')"
    )


def go_quote(value: str) -> str:
    """Go's ``%q`` of a string (``strconv.Quote``): printable characters as they are, the rest escaped."""
    out = ['"']
    for c in value:
        if c in '"\\':
            out.append("\\" + c)
        elif c.isprintable():
            out.append(c)
        elif c in "\a\b\f\n\r\t\v":
            out.append("\\" + "abfnrtv"["\a\b\f\n\r\t\v".index(c)])
        elif ord(c) < 0x80:
            out.append(f"\\x{ord(c):02x}")
        elif ord(c) < 0x10000:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(f"\\U{ord(c):08x}")
    out.append('"')
    return "".join(out)


def dns1123_subdomain_errors(value: str) -> list[str]:
    """``validation.IsDNS1123Subdomain``: pod names, node names, resource-name prefixes."""
    errs = []
    if len(value) > DNS1123_SUBDOMAIN_MAX:
        errs.append(f"must be no more than {DNS1123_SUBDOMAIN_MAX} characters")
    if not _DNS1123_SUBDOMAIN.fullmatch(value):
        errs.append(_regex_error(_DNS1123_SUBDOMAIN_MSG, _DNS1123_SUBDOMAIN_FMT, "example.com"))
    return errs


def qualified_name_errors(value: str) -> list[str]:
    """``validation.IsQualifiedName``: an optional DNS-1123 subdomain prefix and ``/``, then a name
    of at most 63 characters."""
    parts = value.split("/")
    name_error = _regex_error(_QUALIFIED_NAME_MSG, _QUALIFIED_NAME_FMT, "MyName", "my.name", "123-abc")
    if len(parts) > 2:
        return [
            f"a qualified name {name_error} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    errs = []
    name = parts[-1]
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix:
            errs.append("prefix part must be non-empty")
        else:
            errs.extend("prefix part " + m for m in dns1123_subdomain_errors(prefix))
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > QUALIFIED_NAME_MAX:
        errs.append(f"name part must be no more than {QUALIFIED_NAME_MAX} characters")
    if not _QUALIFIED_NAME.fullmatch(name):
        errs.append("name part " + name_error)
    return errs


def is_native_resource(name: str) -> bool:
    """``helper.IsNativeResource``: no domain, or a ``kubernetes.io/`` one."""
    return "/" not in name or "kubernetes.io/" in name


def is_extended_resource_name(name: str) -> bool:
    """``helper.IsExtendedResourceName``: not native, no ``requests.`` prefix, and
    ``requests.<name>`` is a qualified name."""
    if is_native_resource(name) or name.startswith("requests."):
        return False
    return not qualified_name_errors("requests." + name)


def resource_name_errors(name: str) -> list[str]:
    """``validateContainerResourceName``'s messages for a container's limit or request name."""
    errs = qualified_name_errors(name)
    if not errs and "/" not in name and name not in _STANDARD_RESOURCES and not name.startswith("hugepages-"):
        errs.append("must be a standard resource type or fully qualified")
    if "/" not in name:
        if name not in STANDARD_CONTAINER_RESOURCES and not name.startswith("hugepages-"):
            errs.append("must be a standard resource for containers")
    elif not is_native_resource(name) and not is_extended_resource_name(name):
        errs.append("doesn't follow extended resource name standard")
    return errs
