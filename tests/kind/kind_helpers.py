"""Helpers of the kind tier (a module with a unique name, so the tests and conftest.py can import it)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

# Image names and labels come from the kind backend, so the smoke test and the backend agree on them.
from pytest_devplug.backends.kind.lifecycle import python_base_image

__all__ = [
    "REPO",
    "KIND_CONFIG",
    "OFFLINE",
    "KIND_RESOURCE",
    "GPU_TAINT",
    "KindCluster",
    "python_base_image",
    "required",
    "run",
    "script_output",
    "unavailable",
    "wait_for",
]

REPO = Path(__file__).resolve().parents[2]
KIND_CONFIG = REPO / "kind-config"
OFFLINE = KIND_CONFIG / "offline"
#: The resource the kind tier's own tests have the included plugin advertise. Nothing else on the shared e2e cluster
#: does (the lanes' plugins advertise nvidia.com/gpu on nodes of their own), so these tests may assert cluster-wide
#: facts about it (only the GPU worker has it; the scheduler's count of nodes lacking it) while the lanes run.
KIND_RESOURCE = "devplug.io/kind-gpu"
#: The GPU worker's taint (kind-config/*.yaml): pods that go there tolerate it.
GPU_TAINT = "nvidia.com/gpu"


def required() -> bool:
    return os.environ.get("DEVPLUG_KIND_REQUIRED", "").strip().lower() not in ("", "0", "false", "no")


def unavailable(reason: str) -> None:
    """The cluster (or a part it needs) cannot be had: fail under CI, skip elsewhere."""
    if required():
        pytest.fail(f"kind tier required (DEVPLUG_KIND_REQUIRED) but unavailable: {reason}", pytrace=False)
    pytest.skip(reason)


def run(
    cmd: Sequence[str],
    *,
    input: str | None = None,
    timeout: float = 600,
    check: bool = True,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        list(cmd), input=input, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )
    if check and proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}"
            f"\n--- stderr\n{proc.stderr[-4000:]}"
        )
    return proc


def script_output(script: Path) -> str:
    """Run one of the offline build scripts; its last stdout line is its result."""
    proc = run(["bash", str(script)], timeout=3600)
    return proc.stdout.strip().splitlines()[-1]


@dataclass
class KindCluster:
    name: str
    kind: str
    image: str | None
    offline: bool
    config: Path
    nodes: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    def node_container(self, label: str | None = None) -> str:
        """The node container to use: the first node carrying ``label`` (``key=value``), else the first."""
        if label:
            for n in self.nodes:
                labels = self.kubectl_json("get", "node", n)["metadata"].get("labels", {})
                k, _, v = label.partition("=")
                if labels.get(k) == v:
                    return n
            raise AssertionError(f"no node labelled {label} among {self.nodes}")
        return self.nodes[0]

    @property
    def control_plane(self) -> str:
        return f"{self.name}-control-plane"

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """kubectl inside the control-plane node (needs nothing on the host but docker)."""
        return run(
            ["docker", "exec", "-i", self.control_plane, "kubectl", "--kubeconfig=/etc/kubernetes/admin.conf", *args],
            input=input,
            check=check,
            timeout=timeout,
        )

    def kubectl_json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json").stdout)

    def load_image(self, image: str, node: str | None = None) -> None:
        """Into ``node`` (default: every node)."""
        only = ["--nodes", node] if node else []
        run([self.kind, "load", "docker-image", "--name", self.name, *only, image], timeout=600)

    def write_node_file(self, node: str, path: str, content: str) -> None:
        """Replace a file on a node atomically (temp file in the same dir, then rename)."""
        d = os.path.dirname(path)
        run(
            ["docker", "exec", "-i", node, "sh", "-c", f"mkdir -p {d} && cat > {path}.tmp && mv {path}.tmp {path}"],
            input=content,
        )


def wait_for(what: str, probe: Any, timeout: float, interval: float = 2.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = probe()
            if last:
                return last
        except Exception as e:  # noqa: BLE001 - keep polling, report the last error
            last = e
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")
