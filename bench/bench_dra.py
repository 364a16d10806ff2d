"""The DRA example driver on the embedded kubelet's DRA side.

    python bench/bench_dra.py [--runs 5] [--suite-runs 1] [--only register|slices|suite]

``register``: process start -> the plugin watcher registered it and its DRA socket is connected (no API server).
``slices``: with the real control plane, the plugin watcher's registration -> the driver's ResourceSlice visible
through the API server (the issue's target: < 2 s). ``suite``: ``devplug conformance --dra`` against the driver,
wall time of the whole command, control plane start included (target: < 60 s); with ``--suite-runs N`` each run's
verdicts are compared with the first run's (exit status 1 when any differs) and each check's longest time is listed,
where a stall shows.

The driver (built or found cached by peers/build-dra.sh) runs with its plain command line in a private mount
namespace at the kubelet's standard paths. Not a test: numbers are printed, not asserted.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from pytest_devplug.sim.dra.plugins import DRAPluginManager
from pytest_devplug.sim.dra.watcher import DRA_PLUGIN_TYPE, PluginWatcher
from pytest_devplug.procs.process import PluginProcess

ROOT = Path(__file__).resolve().parents[1]
DRIVER = "gpu.example.com"
KUBELET = "/var/lib/kubelet"


def build() -> str:
    peer = "dra-example-kubeletplugin"
    out = subprocess.run(
        ["bash", str(ROOT / "peers" / "build-dra.sh"), peer], capture_output=True, text=True, check=True
    )
    return next(line.split()[1] for line in out.stdout.splitlines() if line.split()[0] == peer)


def one_run(binary: str) -> float:
    with tempfile.TemporaryDirectory(prefix="dra-bench-", dir="/tmp") as tmp:
        root = Path(tmp)
        dirs = {n: root / n for n in ("plugins_registry", "plugins", "cdi")}
        for d in dirs.values():
            d.mkdir()
        (root / "kubeconfig").write_text(
            "apiVersion: v1\nkind: Config\nclusters: [{name: none, cluster: {server: 'https://127.0.0.1:1'}}]\n"
            "users: [{name: none, user: {token: none}}]\n"
            "contexts: [{name: none, context: {cluster: none, user: none}}]\ncurrent-context: none\n"
        )
        plugins = DRAPluginManager(
            "node-1", path_of_endpoint=lambda e: dirs["plugins"] / e.removeprefix(f"{KUBELET}/plugins/")
        )
        watcher = PluginWatcher(dirs["plugins_registry"], {DRA_PLUGIN_TYPE: plugins}, poll_interval=0.005)
        watcher.start()
        proc = PluginProcess(
            [binary, "--node-name", "node-1", "--kubeconfig", str(root / "kubeconfig")],
            log_path=root / "driver.log",
            binds=[
                (dirs["plugins_registry"], f"{KUBELET}/plugins_registry"),
                (dirs["plugins"], f"{KUBELET}/plugins"),
                (dirs["cdi"], "/etc/cdi"),
            ],
        )
        t0 = time.monotonic()
        proc.start()
        try:
            deadline = t0 + 30
            while not plugins.usable(DRIVER):
                if time.monotonic() > deadline or not proc.running:
                    raise TimeoutError(f"{DRIVER} not registered and connected; its log:\n{proc.log()[-2000:]}")
                time.sleep(0.001)
            return time.monotonic() - t0
        finally:
            proc.stop()
            watcher.stop()
            plugins.stop()


def registered_to_slice(binary: str, runs: int) -> list[float]:
    """Seconds from the watcher's registration of the driver to its slice listed by the API server, one deployment
    per run on a node of its own (one control plane for all runs)."""
    from pytest_devplug.backends.base import BackendOptions, NodeSpec
    from pytest_devplug.backends.dra import DriverSpec
    from pytest_devplug.backends.sim import SimBackend
    from pytest_devplug.dra.objects import list_slices

    backend = SimBackend(BackendOptions(control_plane="real"))
    backend.start()
    out = []
    try:
        for i in range(runs):
            name = backend.ensure_node(NodeSpec(f"bench-{i}"))
            kubelet = backend._node(name).dra
            backend.dra.deploy_driver(name, DriverSpec(driver_name=DRIVER, argv=[binary]))
            deadline = time.monotonic() + 60
            registered: float | None = None
            while time.monotonic() < deadline:
                if registered is None:
                    done = [e.at for e in kubelet.registration_events() if e.kind == "registered" and e.name == DRIVER]
                    registered = done[0] if done else None
                if registered is not None and list_slices(backend.dra.rest, node=name, driver=DRIVER):
                    out.append(time.monotonic() - registered)
                    break
                time.sleep(0.005)
            else:
                raise TimeoutError(
                    f"run {i}: no slice of {DRIVER} on {name} within 60 s; "
                    f"driver log:\n{backend.dra.driver_log(name)[-2000:]}"
                )
            backend.dra.remove_driver(name)
    finally:
        backend.close()
    return out


def suite(binary: str) -> tuple[float, str, dict[str, str], dict[str, float]]:
    """Wall seconds of ``devplug conformance --dra`` against the driver, its summary line, each check's verdict and
    each check's time (set-up, call and tear-down), from its junit report."""
    devplug = str(Path(sys.executable).with_name("devplug"))
    with tempfile.TemporaryDirectory(prefix="dra-bench-suite-") as tmp:
        junit = Path(tmp) / "junit.xml"
        t0 = time.monotonic()
        done = subprocess.run(
            [
                devplug,
                "conformance",
                "--dra",
                "--driver-cmd",
                binary,
                "--driver-name",
                DRIVER,
                "--",
                "-q",
                f"--junitxml={junit}",
            ],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
            cwd=tmp,
        )
        wall = time.monotonic() - t0
        verdicts: dict[str, str] = {}
        times: dict[str, float] = {}
        if junit.exists():
            for case in ET.parse(junit).iter("testcase"):
                name = case.get("name", "?")
                verdicts[name] = next(
                    (tag for tag in ("failure", "error", "skipped") if case.find(tag) is not None), "passed"
                )
                times[name] = float(case.get("time", "0"))
    summary = next(
        (ln for ln in reversed(done.stdout.splitlines()) if " in " in ln and ("passed" in ln or "failed" in ln)),
        done.stdout[-300:],
    )
    return wall, summary.strip("= "), verdicts, times


def _ms(values: list[float]) -> str:
    return (
        f"median {statistics.median(values) * 1000:.0f} ms, "
        f"min {min(values) * 1000:.0f} ms, max {max(values) * 1000:.0f} ms"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--suite-runs", type=int, default=1)
    parser.add_argument("--only", choices=("register", "slices", "suite"))
    args = parser.parse_args()
    binary = build()
    if args.only in (None, "register"):
        times = [one_run(binary) for _ in range(args.runs)]
        print(f"dra-example-kubeletplugin start -> registered+connected: {_ms(times)} over {args.runs} runs")
    if args.only in (None, "slices"):
        times = registered_to_slice(binary, args.runs)
        print(
            "dra-example-kubeletplugin registered -> ResourceSlice visible (real API server): "
            f"{_ms(times)} over {args.runs} runs"
        )
    if args.only in (None, "suite"):
        walls: list[float] = []
        first: dict[str, str] | None = None
        differing: list[int] = []
        slowest: dict[str, float] = {}
        for i in range(args.suite_runs):
            wall, summary, verdicts, times = suite(binary)
            walls.append(wall)
            first = verdicts if first is None else first
            if verdicts != first:
                differing.append(i + 1)
            for name, t in times.items():
                slowest[name] = max(slowest.get(name, 0.0), t)
            top = ", ".join(f"{n} {t:.1f} s" for n, t in sorted(times.items(), key=lambda kv: -kv[1])[:3])
            print(
                f"devplug conformance --dra (dra-example-kubeletplugin), run {i + 1}: {wall:.1f} s wall; "
                f"{summary}; slowest: {top}",
                flush=True,
            )
        if args.suite_runs > 1:
            print(
                f"{args.suite_runs} runs: wall median {statistics.median(walls):.1f} s, "
                f"min {min(walls):.1f} s, max {max(walls):.1f} s; "
                "verdict of every check the same as run 1's: "
                f"{'yes' if not differing else f'no, runs {differing}'}"
            )
            print(
                "each check's longest time over the runs: "
                + ", ".join(f"{n} {t:.1f} s" for n, t in sorted(slowest.items(), key=lambda kv: -kv[1])[:8])
            )
    return 1 if args.only in (None, "suite") and differing else 0


if __name__ == "__main__":
    sys.exit(main())
