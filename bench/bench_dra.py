"""The DRA example driver's kubelet plugin on the embedded kubelet's DRA side: process start -> registered.

    python bench/bench_dra.py [--runs 5]

The driver (built or found cached by peers/build-dra.sh) runs with its plain command line in a private
mount namespace at the kubelet's standard paths; the time is from starting the process to the plugin
watcher having registered it and its DRA socket connected (no API server: its slices cannot be published,
which the issue's second target, registered -> slice visible, needs). Not a test: numbers are printed, not
asserted.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pytest_devplug.sim.dra.plugins import DRAPluginManager
from pytest_devplug.sim.dra.watcher import DRA_PLUGIN_TYPE, PluginWatcher
from pytest_devplug.sim.process import PluginProcess

ROOT = Path(__file__).resolve().parents[1]
DRIVER = "gpu.example.com"
KUBELET = "/var/lib/kubelet"


def build() -> str:
    out = subprocess.run(["bash", str(ROOT / "peers" / "build-dra.sh")], capture_output=True, text=True, check=True)
    return out.stdout.split()[-1]


def one_run(binary: str) -> float:
    with tempfile.TemporaryDirectory(prefix="dra-bench-", dir="/tmp") as tmp:
        root = Path(tmp)
        dirs = {n: root / n for n in ("plugins_registry", "plugins", "cdi")}
        for d in dirs.values():
            d.mkdir()
        (root / "kubeconfig").write_text(
            "apiVersion: v1\nkind: Config\nclusters: [{name: none, cluster: {server: 'https://127.0.0.1:1'}}]\n"
            "users: [{name: none, user: {token: none}}]\ncontexts: [{name: none, context: {cluster: none, user: none}}]\ncurrent-context: none\n"
        )
        plugins = DRAPluginManager(
            "node-1", path_of_endpoint=lambda e: dirs["plugins"] / e.removeprefix(f"{KUBELET}/plugins/")
        )
        watcher = PluginWatcher(dirs["plugins_registry"], {DRA_PLUGIN_TYPE: plugins}, poll_interval=0.005)
        watcher.start()
        proc = PluginProcess(
            [binary, "--node-name", "node-1", "--kubeconfig", str(root / "kubeconfig")],
            log_path=root / "driver.log",
            binds=[(dirs["plugins_registry"], f"{KUBELET}/plugins_registry"), (dirs["plugins"], f"{KUBELET}/plugins"), (dirs["cdi"], "/etc/cdi")],
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    binary = build()
    times = [one_run(binary) for _ in range(args.runs)]
    print(f"dra-example-kubeletplugin start -> registered+connected: median {statistics.median(times) * 1000:.0f} ms, "
          f"min {min(times) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms over {args.runs} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
