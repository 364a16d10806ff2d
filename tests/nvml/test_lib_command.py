"""``devplug nvml lib``: the mock library's path, so an NVML plugin can be pointed at it by hand."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from pytest_devplug.backends.mockstate import gpu_uuid, initial_state

DEVPLUG = os.path.join(os.path.dirname(sys.executable), "devplug")


def test_lib_prints_the_mock_and_it_works_by_hand(tmp_path: Path) -> None:
    lib = subprocess.run(
        [DEVPLUG, "nvml", "lib"], capture_output=True, text=True, timeout=300, check=True
    ).stdout.strip()
    lib_dir = subprocess.run([DEVPLUG, "nvml", "lib", "--dir"], capture_output=True, text=True, timeout=60, check=True)
    assert Path(lib).name == "libnvidia-ml.so.1" and Path(lib).is_file(), lib
    assert lib_dir.stdout.strip() == str(Path(lib).parent)
    state = tmp_path / "state.json"
    state.write_text(json.dumps(initial_state(2, 1)))
    env = {**os.environ, "DEVPLUG_NVML_STATE": str(state)}
    probe = subprocess.run(
        [DEVPLUG, "nvml", "probe", "--lib", lib, "--json"], capture_output=True, text=True, timeout=60, env=env
    )
    assert probe.returncode == 0, probe.stderr
    assert gpu_uuid(1) in probe.stdout, probe.stdout
