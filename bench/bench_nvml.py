"""Benchmarks of the mock NVML: Xid-to-Unhealthy latency per plugin, and the idle cost of 10,000 GPUs.

    python bench/bench_nvml.py latency --plugin included --runs 10
    python bench/bench_nvml.py latency --plugin nvidia --runs 10      # builds NVIDIA's plugin (peers/build.sh)
    python bench/bench_nvml.py idle --gpus 10000 --seconds 30

Latency: a critical Xid (79) appended to the mock-state file -> the kubelet's allocatable count drops (the
plugin's ListAndWatch message carrying the Unhealthy device has arrived and been applied). The plugin's own
NVML event wait sets the pace: the mock library wakes a waiter as soon as its inotify thread has re-read the
file. Idle: the included plugin on N mock GPUs, registered and quiet; its CPU time over a window, as a share
of one core (``/proc/<pid>/stat`` utime + stime).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from pytest_devplug.backends.base import PluginSpec
from pytest_devplug.backends import mockstate
from pytest_devplug.nvml import mock_env
from pytest_devplug.settings import default_plugin_argv
from pytest_devplug.sim.embeddedplane import EmbeddedPlane
from pytest_devplug.sim.kubelet import SimNode

from bench_sim import wait  # same folder: the benchmarks share one spin-wait

GPU = "nvidia.com/gpu"
ROOT = Path(__file__).resolve().parents[1]


def write_state(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)


def alloc(c: EmbeddedPlane, node: str) -> int | None:
    value = c.get_node(node)["status"]["allocatable"].get(GPU)
    return None if value is None else int(value)


def nvidia_binary() -> str:
    out = subprocess.run(
        ["bash", str(ROOT / "peers" / "build.sh"), "nvidia-device-plugin"], capture_output=True, text=True, check=True
    ).stdout
    return out.split()[-1]


def plugin_argv(kind: str, state: Path, node: SimNode) -> tuple[list[str], bool]:
    """The plugin's command line on ``node`` and whether it needs the kubelet's standard paths."""
    if kind == "included":
        spec = PluginSpec(argv=default_plugin_argv(GPU, pre_start_required=False))
        return spec.command(plugin_dir=node.plugin_dir, mock_state=state)[0], False
    return [nvidia_binary(), "--device-discovery-strategy", "nvml"], True


def bench_latency(kind: str, runs: int, tmp: Path) -> list[float]:
    state_path = tmp / "state.json"
    state = mockstate.initial_state(runs + 1, 1)
    write_state(state_path, state)
    out = []
    with EmbeddedPlane(grace_period=300.0) as c:
        node = c.add_node("node-1")
        argv, standard = plugin_argv(kind, state_path, node)
        node.start_plugin(argv, env=mock_env(str(state_path)), standard_paths=standard)
        wait(lambda: alloc(c, "node-1") == runs + 1, f"{runs + 1} GPUs allocatable", timeout=60)
        time.sleep(1.0)  # let the plugin reach its event wait
        for r in range(runs):
            state = mockstate.with_xid(state, mockstate.gpu_uuid(r), 79)
            t0 = time.monotonic()
            write_state(state_path, state)
            out.append(wait(lambda r=r: alloc(c, "node-1") == runs - r, "allocatable to drop", timeout=60) - t0)  # type: ignore[misc]
            time.sleep(0.2)
    return out


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_idle(gpus: int, seconds: float, tmp: Path) -> tuple[float, float]:
    """(share of a core while idle, seconds until all GPUs were allocatable)."""
    state_path = tmp / "state.json"
    write_state(state_path, mockstate.initial_state(gpus, 2))
    with EmbeddedPlane(grace_period=300.0) as c:
        node = c.add_node("node-1")
        argv, standard = plugin_argv("included", state_path, node)
        t0 = time.monotonic()
        proc = node.start_plugin(argv, env=mock_env(str(state_path)), standard_paths=standard)
        ready = wait(lambda: alloc(c, "node-1") == gpus, f"{gpus} GPUs allocatable", timeout=600) - t0
        time.sleep(3.0)  # settle: the first ListAndWatch and registration work is done
        assert proc.pid is not None
        before, w0 = cpu_seconds(proc.pid), time.monotonic()
        time.sleep(seconds)
        used, wall = cpu_seconds(proc.pid) - before, time.monotonic() - w0
    return used / wall, ready


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    lat = sub.add_parser("latency")
    lat.add_argument("--plugin", choices=("included", "nvidia"), default="included")
    lat.add_argument("--runs", type=int, default=10)
    idle = sub.add_parser("idle")
    idle.add_argument("--gpus", type=int, default=10_000)
    idle.add_argument("--seconds", type=float, default=30.0)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="devplug-bench-nvml-") as tmp:
        if args.what == "latency":
            runs = bench_latency(args.plugin, args.runs, Path(tmp))
            target = 0.1 if args.plugin == "included" else 1.0
            ms = [round(x * 1000, 1) for x in runs]
            print(
                f"{args.plugin}: Xid 79 -> allocatable drops: median {statistics.median(ms)} ms, max {max(ms)} ms; "
                f"runs (ms) {ms}; target < {target * 1000:.0f} ms"
            )
            return 0 if max(runs) < target else 1
        share, ready = bench_idle(args.gpus, args.seconds, Path(tmp))
        print(
            f"included plugin, {args.gpus} idle mock GPUs: {share * 100:.2f} % of a core over {args.seconds:.0f} s "
            f"(all allocatable after {ready:.1f} s); target < 2 %"
        )
        return 0 if share < 0.02 else 1


if __name__ == "__main__":
    raise SystemExit(main())
