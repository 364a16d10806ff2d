"""etcd, kube-apiserver, kube-scheduler and kube-controller-manager as child processes of the test run.

Each component is a :class:`~pytest_devplug.procs.process.PluginProcess`, the harness's one way to run a
child: its own process group, a parent-death signal (a SIGKILLed run takes them along), SIGTERM then
SIGKILL by PID on stop, killed by the run's SIGTERM/SIGINT handlers, the output in a log file. Ports are
free loopback ports; a component that loses a port race to another run is started again on new ones.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from ..errors import ComponentFailedError, SimError, WaitTimeout
from ..procs.process import PluginProcess
from ..waiting import wait_for
from .pki import Pki

__all__ = ["PORT_RETRIES", "Component", "DetachedProcess", "free_port", "log_tail", "terminate", "write_kubeconfig"]

_TAIL_LINES = 25
#: Retries of a start that lost a port to another run (xdist workers, two CI jobs).
PORT_RETRIES = 3


def free_port() -> int:
    """A loopback port nobody listens on now (the kernel's choice; it may be taken again before use)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def log_tail(path: Path, lines: int = _TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


class DetachedProcess:
    """A component of a control plane kept after the run (``--keep-cluster``): no parent-death signal, its own
    session, so it outlives the test run; stopped later by PID (``devplug control-plane stop``)."""

    def __init__(self, argv: Sequence[str], log_path: Path) -> None:
        self.argv = list(argv)
        self.log_path = log_path
        self._popen: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen is not None else None

    @property
    def returncode(self) -> int | None:
        return self._popen.poll() if self._popen is not None else None

    def start(self) -> None:
        try:
            with open(self.log_path, "ab") as log:
                self._popen = subprocess.Popen(
                    self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
        except OSError as exc:
            raise ComponentFailedError(f"cannot start {self.argv[0]}: {exc}") from None

    def stop(self, timeout: float = 10.0) -> int | None:
        if self._popen is None:
            return None
        return terminate(self._popen.pid, timeout, self._popen)


def terminate(pid: int, timeout: float, popen: subprocess.Popen[bytes] | None = None) -> int | None:
    """SIGTERM the process group of ``pid``, SIGKILL it after ``timeout`` s; the exit status when it is our child."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return popen.poll() if popen is not None else None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if popen is not None:
                if popen.poll() is not None:
                    return popen.returncode
            elif not _alive(pid):
                return None
            time.sleep(0.05)
    return popen.poll() if popen is not None else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not reaped by its parent yet) is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


class Component:
    """One control-plane process: start it, wait until its health endpoint answers, stop it."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        health_url: str,
        ca: Path | None,
        *,
        client_cert: tuple[Path, Path] | None = None,
        detached: bool = False,
    ) -> None:
        self.name = name
        self.log_path = log_path
        self.health_url = health_url
        self.proc: PluginProcess | DetachedProcess = (
            DetachedProcess(argv, log_path) if detached else PluginProcess(list(argv), log_path=log_path)
        )
        self._ca = ca
        self._client_cert = client_cert

    def _context(self) -> ssl.SSLContext | None:
        if not self.health_url.startswith("https"):
            return None
        if self._ca is None:  # the scheduler's and controller manager's self-signed serving certificates
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        else:
            ctx = ssl.create_default_context(cafile=str(self._ca))
        if self._client_cert is not None:
            ctx.load_cert_chain(str(self._client_cert[0]), str(self._client_cert[1]))
        return ctx

    def healthy(self) -> str:
        """``ok`` once the endpoint answers 200, else what it said (or why it could not be reached)."""
        try:
            with urllib.request.urlopen(self.health_url, timeout=2, context=self._context()) as resp:  # noqa: S310 - loopback
                return "ok" if resp.status == 200 else f"HTTP {resp.status}"
        except urllib.error.HTTPError as exc:
            return f"HTTP {exc.code}: {exc.read()[:300]!r}"
        except (OSError, ValueError) as exc:
            return f"not answering: {exc}"

    def launch(self) -> None:
        """Start the process (no wait: components that do not depend on each other start together)."""
        try:
            self.proc.start()
        except SimError as exc:
            raise ComponentFailedError(f"{self.name} did not start: {exc}") from None

    def wait_ready(self, timeout: float) -> None:
        """Wait for health; on failure stop it and raise with its log tail."""

        def exited() -> str | None:
            rc = self.proc.returncode
            return None if rc is None else f"{self.name} exited with status {rc}"

        try:
            wait_for(
                self.healthy,
                lambda s: s == "ok",
                timeout=timeout,
                what=f"{self.name} to answer {self.health_url}",
                interval=0.05,
                give_up=exited,
            )
        except WaitTimeout as exc:
            self.stop()
            raise ComponentFailedError(
                f"{exc}\n--- last lines of {self.log_path}:\n{log_tail(self.log_path)}"
            ) from None

    def port_conflict(self) -> bool:
        return "address already in use" in log_tail(self.log_path, 200)

    def stop(self) -> None:
        try:
            self.proc.stop(timeout=10.0)
        except SimError:
            pass  # survived SIGKILL for 10 s: nothing more can be done from here; the parent-death signal remains

    @property
    def pid(self) -> int | None:
        return self.proc.pid


def write_kubeconfig(path: Path, server: str, pki: Pki, user: str = "devplug-admin") -> None:
    """A kubeconfig with absolute paths to the CA and the admin client certificate (JSON is YAML)."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "devplug", "cluster": {"server": server, "certificate-authority": str(pki.ca_cert)}}],
        "users": [
            {"name": user, "user": {"client-certificate": str(pki.admin_cert), "client-key": str(pki.admin_key)}}
        ],
        "contexts": [{"name": "devplug", "context": {"cluster": "devplug", "user": user}}],
        "current-context": "devplug",
    }
    path.write_text(json.dumps(doc, indent=1) + "\n")
    path.chmod(0o600)
