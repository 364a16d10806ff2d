"""Reading why a plugin died (its fatal line, wherever it is in the log) and why a pod cannot start (its image)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from pytest_devplug.crash import fatal_lines, start_failure

GO_PANIC = (
    "I1201 main.go:1] starting\npanic: runtime error: index out of range [3] with length 3\n\ngoroutine 1 [running]:\n"
    + ("main.f()\n\t/src/main.go:10 +0x1d\n" * 60)
)


def test_go_panic_and_fatal_error() -> None:
    assert fatal_lines(GO_PANIC) == ["panic: runtime error: index out of range [3] with length 3"]
    assert fatal_lines("fatal error: concurrent map writes\n\ngoroutine 7 [running]:\n") == [
        "fatal error: concurrent map writes"
    ]


def test_klog_and_structured_fatal_lines() -> None:
    log = (
        "I1201 10:00:00.000001    1 main.go:1] ok\n"
        "F1201 10:00:00.000002    1 main.go:99] failed to locate libcuda.so.550.54.15\n"
        'time="2026-12-01" level=fatal msg="error starting plugins"\n'
        '{"level":"fatal","msg":"cannot list devices"}\n'
    )
    assert fatal_lines(log) == [
        "F1201 10:00:00.000002    1 main.go:99] failed to locate libcuda.so.550.54.15",
        'time="2026-12-01" level=fatal msg="error starting plugins"',
        '{"level":"fatal","msg":"cannot list devices"}',
    ]


def test_python_traceback_gives_its_exception_line() -> None:
    log = (
        'plugin: starting\nTraceback (most recent call last):\n  File "x.py", line 1, in <module>\n    boom()\n'
        "KeyError: 'x'\n\nDuring handling of the above exception, another exception occurred:\n\n"
        'Traceback (most recent call last):\n  File "x.py", line 3\nOSError: [Errno 98] Address already in use\n'
    )
    assert fatal_lines(log) == ["KeyError: 'x'", "OSError: [Errno 98] Address already in use"]


#: A library whose function calls one nothing loaded defines, and a program using it: what a plugin on a mock NVML
#: that lacks a function it calls hits (its call is bound lazily, at the first call).
CALLER = (
    "int nvmlDeviceGetArchitecture(void *device, unsigned *arch);\n"
    "int arch(void) { unsigned a; return nvmlDeviceGetArchitecture(0, &a); }\n"
)
PROGRAM = (
    "#include <stdio.h>\nint arch(void);\n"
    'int main(void) { puts("I1201 10:00:00.000001 1 main.go:1] listing GPUs"); fflush(stdout); return arch(); }\n'
)


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc) to make the loader fail for real")
def test_the_loaders_symbol_lookup_error_names_the_missing_symbol(tmp_path: Path) -> None:
    """A lazily bound call to a function no loaded library has ends the process with ld.so's line (exit 127):
    the fatal line quoted is that one, with the symbol's name, not the last lines of the log."""
    (tmp_path / "caller.c").write_text(CALLER)
    (tmp_path / "prog.c").write_text(PROGRAM)
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-o", str(tmp_path / "libcaller.so"), str(tmp_path / "caller.c")], check=True
    )
    subprocess.run(
        [
            "cc",
            "-o",
            str(tmp_path / "prog"),
            str(tmp_path / "prog.c"),
            f"-L{tmp_path}",
            "-lcaller",
            f"-Wl,-rpath,{tmp_path}",
            "-Wl,--allow-shlib-undefined",
        ],
        check=True,
    )
    done = subprocess.run([str(tmp_path / "prog")], capture_output=True, text=True, env={})
    assert done.returncode == 127, done
    log = done.stdout + done.stderr + "--- exited: status 127\n"
    [line] = fatal_lines(log)
    assert "symbol lookup error" in line and line.endswith("undefined symbol: nvmlDeviceGetArchitecture"), log


def test_a_library_missing_at_start_is_the_fatal_line() -> None:
    log = (
        "gpu-kubelet-plugin: error while loading shared libraries: libnvidia-ml.so.1: "
        "cannot open shared object file: No such file or directory\n"
    )
    assert fatal_lines(log) == [log.strip()]


def test_ordinary_logs_have_no_fatal_line_and_repeats_are_dropped() -> None:
    assert (
        fatal_lines("I1201 10:00:00.000001 1 x.go:1] panic: not at line start\nE1201 10:00:00.1 1 x.go:2] err\n") == []
    )
    assert fatal_lines(GO_PANIC * 5) == ["panic: runtime error: index out of range [3] with length 3"]


def test_start_failure_names_the_image_the_node_and_the_option() -> None:
    pod = {
        "spec": {"nodeName": "kind-worker"},
        "status": {
            "phase": "Pending",
            "containerStatuses": [
                {
                    "name": "main",
                    "image": "busybox:1.36",
                    "state": {
                        "waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "busybox:1.36"'}
                    },
                }
            ],
        },
    }
    why = start_failure(pod)
    assert why is not None
    assert "'busybox:1.36'" in why and "kind-worker" in why and "ImagePullBackOff" in why, why
    assert "--devplug-workload-image" in why, why
    pod["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "ContainerCreating"}}  # type: ignore[index]
    assert start_failure(pod) is None
    assert start_failure({}) is None
