"""The mock ``libnvidia-ml.so.1``: its C source, its cached build and ``devplug nvml probe``.

Any NVML plugin (Go through go-nvml, Python through pynvml, C) loads the mock when the harness puts its
directory on ``LD_LIBRARY_PATH`` and names the mock-state file in ``DEVPLUG_NVML_STATE``.
"""

from .build import LIB_NAME, STATE_ENV, mock_library

__all__ = [
    "LIB_NAME",
    "STATE_ENV",
    "MOCK_DRIVER_VERSION",
    "mock_library",
    "mock_env",
]

#: The driver version the mock reports (``MOCK_DRIVER_VERSION`` in mock_nvml.c): a GPU node's stub driver root
#: holds ``libcuda.so.<this>``, which NVIDIA's plugin looks for by the version NVML reports.
MOCK_DRIVER_VERSION = "550.54.15"


def mock_env(state_path: str) -> dict[str, str]:
    """What a plugin process needs in its environment to load the mock NVML on ``state_path``.

    ``LD_LIBRARY_PATH`` keeps any value the caller's environment already had, after the mock's directory.
    """
    import os

    lib_dir = str(mock_library().parent)
    inherited = os.environ.get("LD_LIBRARY_PATH", "")
    return {
        "LD_LIBRARY_PATH": f"{lib_dir}:{inherited}" if inherited else lib_dir,
        STATE_ENV: state_path,
    }
