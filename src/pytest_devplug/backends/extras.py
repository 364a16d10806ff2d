"""Which optional extras a backend needs, and the error naming what to install when one is missing.

Apart from the package's ``__init__`` (which picks the backend) so that a backend module can require an extra too
(the sim backend's real control plane needs the ``cluster`` extra) without importing its own package's ``__init__``.
"""

from __future__ import annotations

import importlib.util

from ..errors import BackendUnavailableError

__all__ = ["CLUSTER_MODULES", "KIND_MODULES", "missing_kind_dependencies", "require_extra"]

#: Modules the cluster backend needs (the ``cluster`` extra), by the distribution that provides them.
CLUSTER_MODULES = {"kubernetes": "kubernetes", "yaml": "pyyaml"}
#: Modules the kind backend needs (the ``kind`` extra).
KIND_MODULES = {"pytest_kind": "pytest-kind-ng", **CLUSTER_MODULES}


def _missing(modules: dict[str, str]) -> list[str]:
    return [dist for module, dist in modules.items() if importlib.util.find_spec(module) is None]


def missing_kind_dependencies() -> list[str]:
    """Distributions of the ``kind`` extra that are not installed (none are imported to find out)."""
    return _missing(KIND_MODULES)


def require_extra(backend: str, extra: str, modules: dict[str, str]) -> None:
    """``BackendUnavailableError`` naming the missing distributions and the extra that brings them."""
    missing = _missing(modules)
    if missing:
        raise BackendUnavailableError(
            f"the {backend} backend needs {', '.join(missing)}, which are not installed: "
            f"pip install 'pytest-devplug[{extra}]'"
        )
