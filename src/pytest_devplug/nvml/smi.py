"""``nvidia-smi`` on the mock GPU node: the settings a driver changes with it land in the mock-NVML state.

NVIDIA's DRA driver sets a GPU's compute mode and time-slice (``nvidia-smi -i <UUID> -c DEFAULT``, then
``nvidia-smi compute-policy -i <UUID> --set-timeslice <N>``) when a claim's ``GpuConfig`` asks for time-slicing, and
back to the default on unprepare. Here they set the GPU's ``compute_mode`` and ``timeslice`` in the state file
``DEVPLUG_NVML_STATE`` names, where a check reads what the driver set; anything else is refused
naming this stand-in, so a driver relying on more fails visibly instead of silently. Run by path (stdlib only, no
package import: it runs once per prepare).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: The mock-state field of a GPU holding its time-slice (0 default, 1 short, 2 medium, 3 long: nvidia-smi's values).
TIMESLICE_FIELD = "timeslice"
TIMESLICES = {0: "Default", 1: "Short", 2: "Medium", 3: "Long"}
#: The mock-state field of a GPU holding its compute mode, by nvidia-smi's names (numbers accepted as it does).
COMPUTE_MODE_FIELD = "compute_mode"
COMPUTE_MODES = {"0": "DEFAULT", "1": "EXCLUSIVE_THREAD", "2": "PROHIBITED", "3": "EXCLUSIVE_PROCESS"}
_STATE_ENV = "DEVPLUG_NVML_STATE"
_USAGE = (
    "usage (the mock GPU node's nvidia-smi): nvidia-smi compute-policy -i <UUID|index> --set-timeslice <0-3> | "
    "nvidia-smi -i <UUID|index> -c <mode>"
)


class SmiError(Exception):
    """A call this stand-in cannot answer as nvidia-smi would; exit status 2 with the message."""


def _options(args: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    it = iter(args)
    for arg in it:
        key, eq, value = arg.partition("=")
        if key not in ("-i", "--id", "--set-timeslice", "-c", "--compute-mode"):
            raise SmiError(f"unsupported option {arg!r}")
        out[{"--id": "-i", "--compute-mode": "-c"}.get(key, key)] = value if eq else next(it, "")
    return out


def _gpu(state: dict[str, Any], gpu: str) -> dict[str, Any]:
    gpus = state.get("gpus") or []
    match = [g for i, g in enumerate(gpus) if g.get("uuid") == gpu or str(i) == gpu]
    if not match:
        raise SmiError(f"no GPU {gpu!r} (the mock state has {[g.get('uuid') for g in gpus]})")
    return match[0]  # type: ignore[no-any-return]


def apply(state: dict[str, Any], argv: Sequence[str]) -> tuple[dict[str, Any], str]:
    """``state`` changed as nvidia-smi with ``argv`` changes the GPU, and what nvidia-smi says it did."""
    policy = bool(argv) and argv[0] == "compute-policy"
    opts = _options(argv[1:] if policy else argv)
    if "-i" not in opts:
        raise SmiError("which GPU: -i is required")
    gpu = _gpu(state, opts["-i"])
    if policy and set(opts) == {"-i", "--set-timeslice"}:
        value = opts["--set-timeslice"]
        if not value.isdigit() or int(value) not in TIMESLICES:
            choices = ", ".join(f"{k} ({v})" for k, v in TIMESLICES.items())
            raise SmiError(f"invalid time-slice {value!r}: want one of {choices}")
        gpu[TIMESLICE_FIELD] = int(value)
        return state, f"Set time-slice of GPU {opts['-i']} to {TIMESLICES[int(value)]}."
    if not policy and set(opts) == {"-i", "-c"}:
        mode = COMPUTE_MODES.get(opts["-c"], opts["-c"].upper())
        if mode not in COMPUTE_MODES.values():
            raise SmiError(f"invalid compute mode {opts['-c']!r}: want one of {', '.join(COMPUTE_MODES.values())}")
        gpu[COMPUTE_MODE_FIELD] = mode
        return state, f"Set compute mode to {mode} for GPU {opts['-i']}."
    raise SmiError(f"unsupported command {' '.join(argv)!r}")


def main(argv: Sequence[str]) -> int:
    try:
        path = os.environ.get(_STATE_ENV)
        if not path:
            raise SmiError(f"{_STATE_ENV} is not set: this nvidia-smi only stands in on pytest-devplug's mock GPU node")
        state, said = apply(json.loads(Path(path).read_text()), argv)
        fd, tmp = tempfile.mkstemp(dir=Path(path).parent, prefix=".smi-")
        with os.fdopen(fd, "w") as f:
            json.dump(state, f, indent=1)
        os.replace(tmp, path)  # the mock library re-reads a state file replaced whole
    except (SmiError, OSError, ValueError) as exc:
        print(f"nvidia-smi: {exc}\n{_USAGE}", file=sys.stderr)
        return 2
    print(said)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
