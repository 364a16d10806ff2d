"""What every test folder shares: the resource the included plugin advertises and the one bounded wait.

Test folders are packages (``tests.sim``, ``tests.gpu_plugin``, ...), so any subset of them collects together;
helpers are imported relatively (``from ..support import wait_until``), never ``from conftest import``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

from pytest_devplug.waiting import wait_for
from pytest_devplug.errors import WaitTimeout

if TYPE_CHECKING:
    from pytest_devplug.controlplane import Binaries
    from pytest_devplug.handles import ClusterHandle

__all__ = [
    "DRA_CHECKS_ENV",
    "RESOURCE",
    "WAIT",
    "KnownUpstreamDefect",
    "LIBRARY_BUG_CHECK",
    "LIBRARY_BUG_SYMPTOM",
    "NOT_LIBRARY_BUGS",
    "SuiteResult",
    "assert_suite_passed",
    "control_plane_bin_dir",
    "control_plane_binaries",
    "default_sigint",
    "dra_check_selection",
    "in_ci",
    "parse_junit",
    "run_conformance",
    "selection_mismatch",
    "short_dir",
    "upstream_defect_verdict",
    "wait_until",
]

T = TypeVar("T")

#: The included GPU plugin's extended resource (its default ``--resource-name``).
RESOURCE = "nvidia.com/gpu"

#: Bound of an event-driven wait in the tests. Generous on purpose: a passing wait ends as soon as its event
#: comes, so the bound costs nothing then, and on 2 busy cores one Python process start took over 10 s.
WAIT = 60.0


def wait_until(
    what: str,
    probe: Callable[[], T],
    ok: Callable[[T], bool] = bool,
    *,
    timeout: float = WAIT,
    interval: float = 0.02,
    retry_on: tuple[type[BaseException], ...] = (),
) -> T:
    """Poll ``probe`` until ``ok(value)``; on timeout fail saying what was awaited and the last value (or error)
    seen."""
    __tracebackhide__ = True
    try:
        return wait_for(probe, ok, timeout=timeout, what=what, interval=interval, retry_on=retry_on)
    except WaitTimeout as exc:
        seen: Any = exc.last if exc.last_error is None else exc.last_error
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what}; last seen: {seen!r}") from None


def control_plane_binaries() -> Binaries:
    """The real control plane's binaries: the cache, built there when missing (as ``nox -s tests`` does first)."""
    from pytest_devplug.controlplane import resolve
    from pytest_devplug.errors import BinariesNotFoundError
    from pytest_devplug.controlplane.binaries import build

    try:
        return resolve(download=False)
    except BinariesNotFoundError:
        return build()


def control_plane_bin_dir() -> Path:
    """The directory of the real control plane's binaries (see :func:`control_plane_binaries`)."""
    return control_plane_binaries()["kube-apiserver"].parent


#: The DRA checks a kind test of a driver runs: their names, space-separated; unset, the whole suite.
#: tools/e2e-lanes.sh splits the checks between the included driver and dra-example-driver so that `nox -s e2e` runs
#: each on a real kubelet once (both drivers run the whole suite on the embedded kubelet in `nox -s tests`).
DRA_CHECKS_ENV = "DEVPLUG_DRA_CHECKS"


def dra_check_selection() -> tuple[list[str], frozenset[str] | None]:
    """The pytest arguments that select :data:`DRA_CHECKS_ENV`'s checks, and those names (``None``: every check)."""
    names = frozenset(os.environ.get(DRA_CHECKS_ENV, "").split())
    return (["-k", " or ".join(sorted(names))], names) if names else ([], None)


def selection_mismatch(result: SuiteResult, selected: frozenset[str] | None) -> list[str]:
    """Where ``result`` is not exactly the ``selected`` checks: a selected name without a verdict (it matches no
    check, or the run was cut short), or a check that ran unselected (``-k`` matches substrings); ``[]`` when it is."""
    if selected is None:
        return []
    ran = set(result.verdicts())
    return [f"no verdict: {t}" for t in sorted(selected - ran)] + [f"not selected: {t}" for t in sorted(ran - selected)]


@dataclass
class SuiteResult:
    """A suite run's verdicts, read from its junit report."""

    passed: list[str] = field(default_factory=list)
    #: test -> message, for tests whose body failed (an assertion).
    failures: dict[str, str] = field(default_factory=dict)
    #: test -> message, for set-up or tear-down errors.
    errors: dict[str, str] = field(default_factory=dict)
    #: test -> skip reason.
    skipped: dict[str, str] = field(default_factory=dict)
    #: the run's exit status and the tail of its output (``run_conformance``).
    returncode: int = 0
    output: str = ""

    @property
    def failed(self) -> list[str]:
        """Failures and errors, ``"<test>: <message>"`` each."""
        return [f"{name}: {message}" for name, message in {**self.failures, **self.errors}.items()]

    def verdicts(self) -> dict[str, str]:
        """test -> ``passed`` | ``skipped`` | ``failed`` | ``error``."""
        return {
            **{t: "passed" for t in self.passed},
            **{t: "skipped" for t in self.skipped},
            **{t: "failed" for t in self.failures},
            **{t: "error" for t in self.errors},
        }


def parse_junit(path: Path) -> SuiteResult:
    result = SuiteResult()
    for case in ET.parse(path).iter("testcase"):
        name = case.get("name", "?")
        failure, error, skip = case.find("failure"), case.find("error"), case.find("skipped")
        # the message attribute is cut short by pytest; the element's text holds the rest
        if failure is not None:
            result.failures[name] = failure.get("message", "") + "\n" + (failure.text or "")
        elif error is not None:
            result.errors[name] = error.get("message", "") + "\n" + (error.text or "")
        elif skip is not None:
            result.skipped[name] = skip.get("message", "")
        else:
            result.passed.append(name)
    return result


def in_ci() -> bool:
    """Whether this runs in CI (``CI`` set and not false): there a missing tool or a skipped kind check fails."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


#: The device-status check's skip for a driver that publishes no device status (most drivers: it is optional).
WRITES_NO_DEVICE_STATUS = re.compile(r"writes nothing into a claim's status\.devices")


#: The check of kubernetes/kubernetes#140011, which every released driver on upstream's kubeletplugin library up to
#: v0.37 fails, and what its failure says; a peer's whole-suite run deselects it as a driver's CI may
#: (``NOT_LIBRARY_BUGS``), and a strict xfail of its own judges it.
LIBRARY_BUG_CHECK = "test_slices_come_back_after_an_update_then_a_kubelet_start"
LIBRARY_BUG_SYMPTOM = "inherits kubernetes/kubernetes#140011"
NOT_LIBRARY_BUGS = ("-m", "not upstream_library_bug")


class KnownUpstreamDefect(AssertionError):
    """A peer failed the check about a defect it is known to have upstream, for that defect and nothing else (what
    a strict xfail naming the upstream report expects)."""


def assert_suite_passed(
    result: SuiteResult, what: str, allowed_skips: Sequence[re.Pattern[str]], must_pass: Sequence[str]
) -> None:
    """A peer's suite run: nothing failed, every skip has a reason ``allowed_skips`` explains, ``must_pass`` passed."""
    __tracebackhide__ = True
    assert not result.failed, (
        f"{what}: {len(result.failed)} failed/errors:\n" + "\n".join(result.failed) + result.output
    )
    assert result.returncode == 0, f"{what}: devplug conformance exited {result.returncode}:\n{result.output}"
    unexplained = {t: r for t, r in result.skipped.items() if not any(p.search(r) for p in allowed_skips)}
    assert not unexplained, f"{what}: skips without a reason that fits it: {unexplained}"
    missing = [t for t in must_pass if t not in result.passed]
    assert not missing, f"{what}: expected to pass but did not run or skipped: {missing}; skips: {result.skipped}"


def upstream_defect_verdict(result: SuiteResult, what: str, check: str, symptom: str, upstream: str) -> None:
    """Raise :class:`KnownUpstreamDefect` when ``check`` alone failed, saying ``symptom``; otherwise the check must
    have passed (a skip outside CI skips the test, saying why)."""
    __tracebackhide__ = True
    failure = "\n".join(result.failed)
    if list(result.failures) == [check] and not result.errors and symptom in result.failures[check] + result.output:
        raise KnownUpstreamDefect(f"{what}: {upstream}:\n{failure[-2000:]}")
    if check in result.skipped and not in_ci():
        pytest.skip(f"{what}: {check} skipped: {result.skipped[check]}")
    assert result.passed == [check], (
        f"{what}: expected {check} to run; failed: {failure}; skipped: {result.skipped}\n{result.output}"
    )


def run_conformance(options: Sequence[str], pytest_args: Sequence[str], cwd: Path, *, timeout: float) -> SuiteResult:
    """``devplug conformance OPTIONS -- PYTEST_ARGS`` from this venv, in ``cwd``; its verdicts from the junit report
    (an assertion error with the output's tail when it wrote none)."""
    __tracebackhide__ = True
    junit = cwd / "junit.xml"
    devplug = os.path.join(os.path.dirname(sys.executable), "devplug")
    argv = [devplug, "conformance", *options, "--", "-p", "no:randomly", f"--junitxml={junit}", *pytest_args]
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    output = (done.stdout + done.stderr)[-8000:]
    assert junit.exists(), f"devplug conformance exited {done.returncode} without a junit report:\n{output}"
    result = parse_junit(junit)
    result.returncode, result.output = done.returncode, output
    return result


@contextmanager
def short_dir(prefix: str) -> Iterator[Path]:
    """A fresh directory under /tmp, removed afterwards: a Unix socket path holds at most 107 bytes, and pytest's
    tmp paths (longer still under xdist, ``popen-gwN``) leave too little room for a socket name."""
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


_DEFAULT_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])"
)


def default_sigint(argv: Sequence[str]) -> list[str]:
    """``argv`` run with SIGINT at its default disposition (the same process: exec keeps the pid and session). A test
    that interrupts a child as a terminal does must not depend on how the test run was started: a script's
    background job runs with SIGINT ignored, its children inherit that, and the harness rightly leaves it ignored."""
    return [sys.executable, "-c", _DEFAULT_SIGINT, *argv]


@contextmanager
def sim_cluster(timeout: float = 20.0) -> Iterator[ClusterHandle]:
    """A cluster on the sim backend for a test that deploys plugins of its own; closed (its plugins and nodes gone)
    afterwards."""
    from pytest_devplug.backends.base import BackendOptions
    from pytest_devplug.backends.sim import SimBackend
    from pytest_devplug.handles import ClusterHandle

    backend = SimBackend(BackendOptions(timeout=timeout))
    backend.start()
    try:
        yield ClusterHandle(backend, timeout=timeout)
    finally:
        backend.close()
