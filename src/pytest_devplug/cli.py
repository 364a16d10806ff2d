"""The ``devplug`` command: inspect kubelet checkpoints, run the conformance suite, manage the real control plane's
binaries, probe an NVML library."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from .checkpoint_view import (
    checkpoint_as_dict,
    dra_checkpoint_as_dict,
    format_checkpoint,
    format_dra_checkpoint,
    printable,
)
from .kubeletmodel.checkpoint import CheckpointData, checksum, decode
from .errors import CheckpointError
from .kubeletmodel.releases import DEFAULT_VERSION, releases
from .options import add_cli_flags, cli_pytest_args, option
from .kubeletmodel.checkpointfile import read_bytes
from .kubeletmodel import dracheckpoint as dra_checkpoint

__all__ = ["main"]

#: The status of a command whose reader went away (``| head``): what a process killed by
#: SIGPIPE reports in the shell, as ``cat`` or ``git log`` do.
EXIT_BROKEN_PIPE = 141


def _load(path: str) -> tuple[CheckpointData, int, int] | dra_checkpoint.DRACheckpointFile | str:
    """The data, stored and computed checksums (a ``dra_manager_state`` file: its decoded form), or a
    message saying why the file is unusable."""
    try:
        blob = read_bytes(Path(path))
        if dra_checkpoint.is_dra_checkpoint(blob):
            return dra_checkpoint.decode(blob, source=path)
        data, stored = decode(blob, source=path)
    except OSError as exc:
        return f"{path}: cannot read: {exc.strerror or exc}"
    except CheckpointError as exc:
        return str(exc)
    return data, stored, checksum(data)


def _checkpoint(args: argparse.Namespace) -> int:
    """``show`` prints the file (a bad checksum is reported, not fatal); ``verify`` judges the checksum."""
    loaded = _load(args.file)
    if isinstance(loaded, str):
        print(f"devplug checkpoint {args.action}: {printable(loaded)}", file=sys.stderr)
        return 2
    stored, computed = (
        (loaded.stored, loaded.computed) if isinstance(loaded, dra_checkpoint.DRACheckpointFile) else loaded[1:]
    )
    name = printable(args.file)
    if args.action == "verify":
        if stored != computed:
            print(f"{name}: checksum mismatch: stored {stored}, computed {computed}", file=sys.stderr)
            return 1
        print(f"{name}: checksum {stored} ok")
    elif isinstance(loaded, dra_checkpoint.DRACheckpointFile):
        print(
            json.dumps(dra_checkpoint_as_dict(loaded), indent=2)
            if args.json
            else format_dra_checkpoint(args.file, loaded)
        )
    elif args.json:
        print(json.dumps(checkpoint_as_dict(loaded[0], stored, computed), indent=2))
    else:
        print(format_checkpoint(args.file, loaded[0], stored, computed))
    return 0


def _add_checkpoint_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cp = sub.add_parser("checkpoint", help="inspect a kubelet_internal_checkpoint or dra_manager_state file")
    cps = cp.add_subparsers(dest="action", required=True)
    show = cps.add_parser("show", help="print the checkpoint readably, Allocate responses decoded")
    show.add_argument("file")
    show.add_argument("--json", action="store_true", help="print JSON instead of text")
    show.set_defaults(func=_checkpoint)
    verify = cps.add_parser("verify", help="exit 0 when the kubelet's checksum matches, 1 when not")
    verify.add_argument("file")
    verify.set_defaults(func=_checkpoint)


# -- conformance (plugin layer) ------------------------------------------------------------------


def _run_conformance(args: argparse.Namespace) -> int:
    """Run the shipped suite through ``pytest.main`` against exactly the plugin these options name.

    Hermetic: the suite's own ini file (``-c``) instead of any of the cwd, and its directory as the one
    path argument, so pytest loads no ``conftest.py`` of the cwd or its ``test*`` folders (with
    ``--pyargs`` it would, and their ``devplug_plugin_spec`` would replace ``--plugin-cmd``).
    """
    import pytest

    from . import conformance
    from .dra import conformance as dra_conformance
    from .plugin import NO_PLUGIN_MESSAGE, included_plugin_installed

    backend = args.backend or option("backend").default
    if args.dra:
        if args.control_plane == "embedded" or (backend != "sim" and args.control_plane):
            print(
                "devplug conformance: --dra runs DRA drivers on the embedded kubelet with the real control plane "
                "(--control-plane real, implied) or on kind (--backend kind); drop --control-plane",
                file=sys.stderr,
            )
            return int(pytest.ExitCode.USAGE_ERROR)
        if backend == "sim":
            args.control_plane = "real"
        driver_flags = ("--devplug-driver-cmd", "--devplug-driver-manifest", "--devplug-driver-image")
        custom = (
            args.driver_cmd
            or args.driver_manifest
            or args.driver_image
            or any(a.startswith(driver_flags) for a in args.pytest_args)
        )
        missing = "DRA driver: no --driver-cmd was given"
    else:
        plugin_flags = ("--devplug-plugin-cmd", "--devplug-plugin-image", "--devplug-plugin-manifest")
        custom = args.plugin_cmd or args.plugin_image or args.plugin_manifest
        custom = custom or any(a.startswith(plugin_flags) for a in args.pytest_args)
        missing = ""
    if backend == "sim" and not custom and not included_plugin_installed():
        what = (
            f"no {missing}, and the included GPU plugin (its DRA mode) is not installed: "
            "pip install 'pytest-devplug[gpu-plugin]'"
            if args.dra
            else NO_PLUGIN_MESSAGE
        )
        print(f"devplug conformance: {what}", file=sys.stderr)
        return int(pytest.ExitCode.USAGE_ERROR)

    suite = Path(str((dra_conformance if args.dra else conformance).__file__)).parent
    pytest_args = [
        "-c",
        str(suite / "pytest.ini"),
        "--rootdir",
        str(suite),
        "--confcutdir",
        str(suite),
        "-p",
        "no:cacheprovider",
        "-W",
        "ignore::pytest.PytestAssertRewriteWarning",
        "-rfEs",
        "-v",
        str(suite),
    ]
    pytest_args += cli_pytest_args(args)
    extra = list(args.pytest_args)
    if extra[:1] == ["--"]:
        extra = extra[1:]
    return int(pytest.main([*pytest_args, *extra]))


def _add_conformance_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    conf = sub.add_parser(
        "conformance",
        help="run the shipped conformance suite against a device plugin (--dra: a DRA driver)",
        description="Run pytest_devplug.conformance (with --dra: pytest_devplug.dra.conformance). Without plugin "
        "(driver) options it tests the included GPU plugin on a mock NVML. Arguments after -- go to pytest "
        "(e.g. -- -k registration -x).",
    )
    add_cli_flags(conf)
    conf.add_argument(
        "--dra",
        action="store_true",
        help="judge a DRA driver (--driver-cmd, --driver-name; on kind --driver-manifest, --driver-image; default: the "
        "included GPU plugin's DRA mode) with the DRA suite, on the embedded kubelet with the real control plane or "
        "on kind",
    )
    conf.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after --: arguments for pytest")
    conf.set_defaults(func=_run_conformance)


# -- control plane -------------------------------------------------------------------------------


def _control_plane(args: argparse.Namespace) -> int:
    """``build``: the binaries into the cache (from Go modules; instant when cached); ``where``: which are used;
    ``stop DIR``: end a control plane kept by ``--keep-cluster``."""
    from .controlplane import resolve
    from .errors import ControlPlaneError
    from .controlplane.binaries import build
    from .controlplane.plane import stop_kept
    from .errors import VersionError

    try:
        if args.action == "build":
            found = build(version=args.kubernetes_version)
        elif args.action == "where":
            found = resolve(args.k8s_bin_dir, version=args.kubernetes_version, download=False)
        else:
            for line in stop_kept(Path(args.dir)):
                print(line)
            return 0
    except VersionError as exc:
        print(f"devplug control-plane {args.action}: --kubernetes-version: {exc}", file=sys.stderr)
        return 2
    except ControlPlaneError as exc:
        print(f"devplug control-plane {args.action}: {exc}", file=sys.stderr)
        return 1
    print(found.describe())
    for component, path in sorted(found.paths.items()):
        print(f"{component}: {path}")
    return 0


def _add_control_plane_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cp = sub.add_parser(
        "control-plane", help="the binaries and kept instances of the real control plane (sim --control-plane real)"
    )
    cps = cp.add_subparsers(dest="action", required=True)
    build = cps.add_parser(
        "build",
        help="build etcd and the Kubernetes binaries from Go modules into the cache (needs Go and the Go module proxy)",
    )
    where = cps.add_parser("where", help="print the binaries --devplug-control-plane real would use (no download)")
    where.add_argument("--k8s-bin-dir", help="as --devplug-k8s-bin-dir")
    for command in (build, where):
        command.add_argument(
            "--kubernetes-version", help=f"the release (default {DEFAULT_VERSION}; one of {', '.join(releases())})"
        )
        command.set_defaults(func=_control_plane)
    stop = cps.add_parser("stop", help="stop a control plane kept by --keep-cluster and remove its directory")
    stop.add_argument("dir", help="its directory (printed at the end of the kept run)")
    stop.set_defaults(func=_control_plane)


# -- nvml ----------------------------------------------------------------------------------------


def _nvml_probe(args: argparse.Namespace) -> int:
    """Print what an NVML library reports; ``--mock STATE`` probes the mock library on that state file."""
    import os
    from dataclasses import asdict

    from .nvml import STATE_ENV, mock_library
    from .errors import MockBuildError
    from .nvml.probe import format_report, probe
    from .errors import NvmlError

    lib = args.lib
    if args.mock is not None:
        if not os.path.isfile(args.mock):
            print(f"devplug nvml probe: mock state {args.mock}: no such file", file=sys.stderr)
            return 2
        os.environ[STATE_ENV] = os.path.abspath(args.mock)
        try:
            lib = str(mock_library())
        except MockBuildError as exc:
            print(f"devplug nvml probe: {exc}", file=sys.stderr)
            return 2
    try:
        report = probe(lib)
    except OSError as exc:
        print(f"devplug nvml probe: cannot load {lib}: {exc}", file=sys.stderr)
        return 1
    except NvmlError as exc:
        print(f"devplug nvml probe: {lib}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(asdict(report), indent=2) if args.json else format_report(report))
    return 0


def _nvml_lib(args: argparse.Namespace) -> int:
    """Print the mock library's path (building it at first use), so a plugin can be pointed at it by hand."""
    from .nvml import mock_library
    from .errors import MockBuildError

    try:
        lib = mock_library()
    except MockBuildError as exc:
        print(f"devplug nvml lib: {exc}", file=sys.stderr)
        return 2
    print(lib.parent if args.dir else lib)
    return 0


def _add_nvml_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    nvml = sub.add_parser("nvml", help="the NVML library a GPU plugin sees (real or the mock)")
    nvmls = nvml.add_subparsers(dest="action", required=True)
    p = nvmls.add_parser(
        "probe",
        help="print devices, UUIDs, memory, NUMA, PCI and supported events as NVML reports them",
        description="Load an NVML library and print what it reports. Default: the loader's libnvidia-ml.so.1 "
        "(a GPU node's driver).",
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument("--lib", default="libnvidia-ml.so.1", help="path of the library (default: the loader's search)")
    which.add_argument("--mock", metavar="STATE", help="probe the mock library on this mock-state file")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=_nvml_probe)
    lib = nvmls.add_parser(
        "lib",
        help="print the path of the mock libnvidia-ml.so.1 (built at first use)",
        description="Print the mock library's path, e.g. devplug-gpu-plugin --nvml mock --nvml-lib \"$(devplug nvml "
        'lib)" --mock-state STATE, or LD_LIBRARY_PATH="$(devplug nvml lib --dir)" DEVPLUG_NVML_STATE=STATE for '
        "another NVML plugin.",
    )
    lib.add_argument("--dir", action="store_true", help="print its directory (for LD_LIBRARY_PATH) instead")
    lib.set_defaults(func=_nvml_lib)


class _Parser(argparse.ArgumentParser):
    """A usage error is one line and the help command, not the whole usage first (``devplug conformance`` has some
    forty options): exit status 2, as argparse's."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n(`{self.prog} --help` lists the options)\n")


def build_parser() -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = _Parser(prog="devplug", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_checkpoint_commands(sub)
    _add_conformance_command(sub)
    _add_control_plane_commands(sub)
    _add_nvml_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader closed the pipe: stop quietly, and keep the interpreter's final flush of
        # stdout from raising again on the way out.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE
    return code


if __name__ == "__main__":
    raise SystemExit(main())
