"""The mock NVML in a plugin's or DRA driver's process environment, shared by the sim backend's two sides."""

from __future__ import annotations

from pathlib import Path

from ..errors import BackendError, MockBuildError
from ..nvml import mock_env

__all__ = ["mock_nvml_env"]


def mock_nvml_env(mock_path: Path) -> dict[str, str]:
    """The mock libnvidia-ml.so.1 for the plugin's process: its directory first on ``LD_LIBRARY_PATH``
    and the state file in ``DEVPLUG_NVML_STATE``, so an NVML plugin in any language loads it."""
    try:
        return mock_env(str(mock_path))
    except MockBuildError as exc:
        raise BackendError(f"cannot give the plugin the mock NVML: {exc}") from None
