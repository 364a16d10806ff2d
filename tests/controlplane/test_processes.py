"""The control plane's certificates and process lives, on stand-in binaries (no Kubernetes needed):
a component that fails shows its log tail, everything started is stopped, nothing is left behind."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from pytest_devplug.controlplane import Binaries, ControlPlane
from pytest_devplug.errors import ComponentFailedError, ControlPlaneError
from pytest_devplug.controlplane.plane import stop_kept
from pytest_devplug.controlplane.pki import make_pki
from pytest_devplug.controlplane.processes import DetachedProcess
from pytest_devplug.procs.process import start_time


def test_pki_chain_and_names(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    for cert in (pki.server_cert, pki.admin_cert):
        out = subprocess.run(
            ["openssl", "verify", "-CAfile", str(pki.ca_cert), str(cert)], capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
    sans = subprocess.run(
        ["openssl", "x509", "-in", str(pki.server_cert), "-noout", "-ext", "subjectAltName"],
        capture_output=True,
        text=True,
    ).stdout
    assert "IP Address:127.0.0.1" in sans and "DNS:kubernetes.default.svc" in sans
    subject = subprocess.run(
        ["openssl", "x509", "-in", str(pki.admin_cert), "-noout", "-subject"], capture_output=True, text=True
    ).stdout
    assert "O = system:masters" in subject
    assert (tmp_path / "pki").stat().st_mode & 0o077 == 0


def _stand_ins(d: Path, etcd_body: str) -> Binaries:
    d.mkdir()
    paths = {}
    for c in ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager"):
        p = d / c
        p.write_text(etcd_body if c == "etcd" else "#!/bin/sh\nexit 3\n")
        p.chmod(0o755)
        paths[c] = p
    return Binaries(paths, {c: "test" for c in paths}, "v0.0.0-test", "v0.0.0-test")


def test_a_component_that_exits_shows_its_log_tail_and_nothing_is_left(tmp_path: Path) -> None:
    bins = _stand_ins(tmp_path / "bin", "#!/bin/sh\necho 'etcd: bad flag --unsafe-no-fsync' >&2\nexit 1\n")
    cp = ControlPlane(bins, timeout=10)
    with pytest.raises(ComponentFailedError) as ei:
        cp.start()
    msg = str(ei.value)
    assert "etcd exited with status 1" in msg and "etcd: bad flag --unsafe-no-fsync" in msg
    assert cp.components == [] and cp.dir is None


def test_a_component_that_never_answers_is_stopped_by_pid(tmp_path: Path) -> None:
    bins = _stand_ins(tmp_path / "bin", "#!/bin/sh\necho started $$\nexec sleep 600\n")
    cp = ControlPlane(bins, timeout=1)
    with pytest.raises(
        ComponentFailedError, match=r"timed out after 1s waiting for etcd to answer http://127\.0\.0\.1:\d+/health"
    ):
        cp.start()
    logs = list(tmp_path.glob("**/etcd.log"))
    assert logs == [], "the control plane's dir is removed"
    out = subprocess.run(["pgrep", "-f", f"{tmp_path}/bin/etcd"], capture_output=True, text=True)
    assert out.stdout == "", f"etcd stand-in still running: {out.stdout}"


def test_a_kept_process_is_stopped_by_its_recorded_pid(tmp_path: Path) -> None:
    proc = DetachedProcess(["sleep", "600"], tmp_path / "sleep.log")
    proc.start()
    assert proc.pid is not None
    d = tmp_path / "kept"
    d.mkdir()
    (d / "pids.json").write_text(
        f'{{"etcd": {{"pid": {proc.pid}, "start": "{start_time(proc.pid)}"}}, "gone": {{"pid": 1, "start": "0"}}}}'
    )
    assert stop_kept(d) == [f"etcd: pid {proc.pid} stopped", "gone: not running"]
    assert proc.returncode is not None and not d.exists()
    with pytest.raises(ControlPlaneError, match="no pids.json; not a control plane kept by --keep-cluster"):
        stop_kept(tmp_path)
    assert os.path.exists(tmp_path / "sleep.log")
