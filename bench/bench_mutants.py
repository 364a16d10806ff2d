"""Suite power: run the conformance suite on the embedded kubelet against buggy variants of plugins and clean
ones, and report which check caught each bug.

Python: ``bench/mutants/gadget_plugin.py`` (a small plugin with a health file, its project conftest giving the
suite a fault injector), one bug per ``GADGET_BUG`` value. Go: upstream's device-plugin stub
(``peers/stub-plugin/main.go``) with one line changed, built with the Go toolchain next to the cached peer
build (``peers/build.sh stub-plugin``) and cached by the patched source's hash.

    python bench/bench_mutants.py [--only NAME ...]      # prints a Markdown table; exits 1 if a bug escaped

Each run stops at its first failure (``-x``): the test named is the first check that caught the bug.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MUTANTS = ROOT / "bench" / "mutants"
CACHE = Path(
    os.environ.get("DEVPLUG_CACHE_DIR")
    or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pytest-devplug"
)
RUN_TIMEOUT_S = 900

PY_BUGS = [
    "law-ends",
    "no-reregister",
    "ids-change",
    "sticky-unhealthy",
    "init-reuse",
    "first-stream-only",
    "register-first",
    "single-instance",
    "prestart-swallows",
    "health-after-prestart",
    "numa-minus-one",
    "reregister-first-only",
    "allocate-first-table",
]
#: Go mutants of the stub peer: name -> (what, original line, buggy line) in main.go.
GO_BUGS = {
    "stub-ids-change": (
        "device IDs carry the process ID (differ after every restart)",
        'ID:       fmt.Sprintf("numa%d-dev%d", n, i),',
        'ID:       fmt.Sprintf("numa%d-dev%d-%d", n, i, os.Getpid()),',
    ),
}


@dataclass
class Verdict:
    variant: str
    failed: list[str]
    passed: int
    skipped: int
    seconds: float


def _junit(path: Path) -> tuple[list[str], int, int]:
    failed, passed, skipped = [], 0, 0
    for case in ET.parse(path).iter("testcase"):
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            failed.append(f"{case.get('name')}: {(bad.get('message') or '').splitlines()[0][:160]}")
        elif case.find("skipped") is not None:
            skipped += 1
        else:
            passed += 1
    return failed, passed, skipped


def run_gadget(bug: str, stop_first: bool) -> Verdict:
    with tempfile.TemporaryDirectory(prefix="devplug-mutant-") as tmp:
        junit = Path(tmp) / "junit.xml"
        argv = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:pytest-kind-ng",
            "-p",
            "no:cacheprovider",
            f"--junitxml={junit}",
            "--rootdir",
            str(MUTANTS),
            "-c",
            os.devnull,
            str(MUTANTS),
        ]
        if stop_first:
            argv.append("-x")
        started = time.monotonic()
        done = subprocess.run(
            argv, env={**os.environ, "GADGET_BUG": bug}, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
        )
        if not junit.exists():
            raise RuntimeError(
                f"{bug}: pytest exited {done.returncode} without a report:\n{done.stdout[-3000:]}{done.stderr[-2000:]}"
            )
        return Verdict(f"gadget {bug}", *_junit(junit), time.monotonic() - started)


def build_go_mutant(name: str) -> Path:
    _, original, buggy = GO_BUGS[name]
    out = subprocess.run(
        ["bash", str(ROOT / "peers" / "build.sh"), "stub-plugin"],
        capture_output=True,
        text=True,
        check=True,
        timeout=3600,
    )
    binary = Path(out.stdout.split()[-1])
    mod = binary.parent.parent / "mod"
    source = (mod / "main.go").read_text()
    if original not in source:
        raise RuntimeError(f"{name}: the line to change is not in {mod / 'main.go'}: {original!r}")
    patched = source.replace(original, buggy)
    target = (
        CACHE
        / "mutants"
        / f"{name}-{hashlib.sha256(patched.encode() + (mod / 'go.mod').read_bytes()).hexdigest()[:12]}"
    )
    exe = target / "bin" / "stub-plugin"
    if exe.exists():
        return exe
    work = target / "mod"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    for f in ("go.mod", "go.sum"):
        shutil.copy(mod / f, work / f)
    (work / "main.go").write_text(patched)
    go = os.environ.get("GO") or shutil.which("go") or "/usr/local/go/bin/go"
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod"}
    subprocess.run(
        [go, "build", "-trimpath", "-tags", "providerless", "-ldflags", "-s -w", "-o", str(exe) + ".tmp", "."],
        cwd=work,
        env=env,
        check=True,
        timeout=3600,
    )
    os.replace(str(exe) + ".tmp", exe)
    return exe


def run_stub(binary: Path, label: str, stop_first: bool) -> Verdict:
    with tempfile.TemporaryDirectory(prefix="devplug-mutant-") as tmp:
        junit = Path(tmp) / "junit.xml"
        devplug = Path(sys.executable).parent / "devplug"
        argv = [
            str(devplug),
            "conformance",
            "--plugin-cmd",
            str(binary),
            "--resource-name",
            "example.com/stub",
            "--pre-start-required",
            "--conventions",
            "ids-visible,numa-packing",
            "--",
            "-p",
            "no:pytest-kind-ng",
            f"--junitxml={junit}",
        ] + (["-x"] if stop_first else [])
        started = time.monotonic()
        done = subprocess.run(argv, cwd=tmp, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        if not junit.exists():
            raise RuntimeError(f"{label}: devplug exited {done.returncode} without a report:\n{done.stdout[-3000:]}")
        return Verdict(label, *_junit(junit), time.monotonic() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only", nargs="*", help="variants to run (gadget bug names, Go mutant names, clean-gadget, clean-stub)"
    )
    args = parser.parse_args()
    want = set(args.only or [])
    pick = lambda n: not want or n in want  # noqa: E731
    verdicts: list[tuple[str, Verdict]] = []
    if pick("clean-gadget"):
        verdicts.append(("clean", run_gadget("none", stop_first=False)))
    for bug in PY_BUGS:
        if pick(bug):
            verdicts.append(("bug", run_gadget(bug, stop_first=True)))
    if pick("clean-stub"):
        out = subprocess.run(
            ["bash", str(ROOT / "peers" / "build.sh"), "stub-plugin"], capture_output=True, text=True, check=True
        )
        verdicts.append(("clean", run_stub(Path(out.stdout.split()[-1]), "stub (Go) clean", stop_first=False)))
    for name, (what, _, _) in GO_BUGS.items():
        if pick(name):
            verdicts.append(("bug", run_stub(build_go_mutant(name), f"stub (Go) {name}: {what}", stop_first=True)))
    bugs = [v for kind, v in verdicts if kind == "bug"]
    caught = [v for v in bugs if v.failed]
    clean_failed = sum(len(v.failed) for kind, v in verdicts if kind == "clean")
    print(f"caught {len(caught)}/{len(bugs)}, clean {clean_failed} failed\n")
    print("| variant | verdict | caught by (first failure) | wall s |\n|---|---|---|--:|")
    for kind, v in verdicts:
        verdict = (
            f"{v.passed} passed, {v.skipped} skipped, {len(v.failed)} failed"
            if kind == "clean"
            else ("caught" if v.failed else "**escaped**")
        )
        print(f"| {v.variant} | {verdict} | {v.failed[0] if v.failed else ''} | {v.seconds:.1f} |")
    return 0 if len(caught) == len(bugs) and clean_failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
