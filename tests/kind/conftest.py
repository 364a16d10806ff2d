"""Fixtures of the kind tier: one real kind cluster per session, torn down at the end.

Which node image: ``--kind-image`` (pytest-kind-ng's option) or ``$DEVPLUG_KIND_NODE_IMAGE``; else the
offline image built by ``kind-config/offline/build-node-image.sh`` when it is present locally (or when
``DEVPLUG_KIND_OFFLINE=1``, which builds it); else kind's own default image (users' machines).
With an offline image the cluster config is patched by ``kind-config/offline/patch-config.py``.
``$DEVPLUG_KIND_CONFIG`` picks the config in kind-config/ (default single-node.yaml).

When the cluster cannot be had the tests are skipped, except where ``DEVPLUG_KIND_REQUIRED`` is set
(``nox -s e2e`` sets it under CI): there they fail.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Iterator

import pytest

from .kind_helpers import KIND_CONFIG, OFFLINE, KindCluster, run, script_output, unavailable

from pytest_devplug.backends.kind.lifecycle import (
    OFFLINE_LABEL,
    image_labels,
    offline_image_present,
    offline_node_image_name,
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "kind: needs a real kind cluster (run by `nox -s e2e`)")


def _kind_bin(config: pytest.Config) -> str:
    opt = config.getoption("kind_bin", default=None)
    if opt:
        return str(opt)
    return script_output(OFFLINE / "ensure-kind.sh")


def _node_image(config: pytest.Config) -> tuple[str | None, bool]:
    image = config.getoption("kind_image", default=None) or os.environ.get("DEVPLUG_KIND_NODE_IMAGE")
    if not image:
        offline_env = os.environ.get("DEVPLUG_KIND_OFFLINE", "").strip().lower()
        if offline_env in ("1", "true", "yes"):
            image = script_output(OFFLINE / "build-node-image.sh")
        elif offline_env not in ("0", "false", "no") and offline_image_present():
            image = offline_node_image_name()
    if not image:
        return None, False
    labels = image_labels(image) or {}
    return str(image), OFFLINE_LABEL in labels


@pytest.fixture(scope="session")
def kind_cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KindCluster]:
    config = request.config
    if shutil.which("docker") is None or run(["docker", "info"], check=False, timeout=60).returncode != 0:
        unavailable("no working Docker engine (`docker info` fails)")
    try:
        kind = _kind_bin(config)
        image, offline = _node_image(config)
    except Exception as e:  # noqa: BLE001
        unavailable(f"kind or its node image cannot be had: {e}")
        raise
    name = os.environ.get("DEVPLUG_KIND_CLUSTER", "devplug-smoke")
    keep = bool(config.getoption("keep_cluster", default=False))
    src = KIND_CONFIG / os.environ.get("DEVPLUG_KIND_CONFIG", "single-node.yaml")
    cfg = src
    if offline:
        cfg = tmp_path_factory.mktemp("kind") / f"offline-{src.name}"
        run([sys.executable, str(OFFLINE / "patch-config.py"), str(src), str(cfg)])
    cluster = KindCluster(name=name, kind=kind, image=image, offline=offline, config=cfg)

    existing = run([kind, "get", "clusters"], check=False).stdout.split()
    created = False
    if name in existing and keep:
        print(f"\nreusing kind cluster {name} (--keep-cluster)")
    else:
        if name in existing:
            run([kind, "delete", "cluster", "--name", name])
        cmd = [kind, "create", "cluster", "--name", name, "--config", str(cfg), "--wait", "180s", "--retain"]
        if image:
            cmd += ["--image", image]
        t0 = time.monotonic()
        proc = run(cmd, check=False, timeout=900)
        cluster.timings["create_s"] = time.monotonic() - t0
        created = True
        if proc.returncode != 0:
            diag = _diagnose(name)
            run([kind, "delete", "cluster", "--name", name], check=False)
            unavailable(f"`{' '.join(cmd)}` failed ({proc.returncode}):\n{proc.stderr[-3000:]}\n{diag}")
        print(
            f"\nkind cluster {name} created in {cluster.timings['create_s']:.1f}s "
            f"(image {image or 'kind default'}, offline={offline}, config {cfg.name})"
        )
    cluster.nodes = run([kind, "get", "nodes", "--name", name]).stdout.split()
    try:
        yield cluster
    finally:
        if keep:
            print(f"\nkeeping kind cluster {name} (--keep-cluster); delete with: {kind} delete cluster --name {name}")
        elif created or name in existing:
            run([kind, "delete", "cluster", "--name", name], check=False, timeout=300)
            left = run(["docker", "ps", "-aq", "--filter", f"label=io.x-k8s.kind.cluster={name}"], check=False)
            assert not left.stdout.strip(), f"kind left containers behind: {left.stdout.split()}"


def _diagnose(name: str) -> str:
    """Last lines of the node's journal for kubelet/containerd, to make a failed create readable."""
    node = f"{name}-control-plane"
    out = []
    for unit in ("kubelet", "containerd"):
        p = run(["docker", "exec", node, "journalctl", "--no-pager", "-n", "40", "-u", unit], check=False)
        out.append(f"--- {unit} journal ({node})\n{p.stdout[-3000:]}{p.stderr[-500:]}")
    p = run(["docker", "logs", "--tail", "40", node], check=False)
    out.append(f"--- docker logs {node}\n{p.stdout[-3000:]}{p.stderr[-1000:]}")
    return "\n".join(out)
