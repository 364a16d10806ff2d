"""The ``devplug`` command: inspect kubelet checkpoints and run the conformance suite."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from .checkpoint_view import checkpoint_as_dict, format_checkpoint
from .sim.checkpoint import CheckpointData, CheckpointError, checksum, decode

__all__ = ["main"]


def _load(path: str) -> tuple[CheckpointData, int, int] | str:
    """The data, stored and computed checksums, or a message saying why the file is unusable."""
    try:
        data, stored = decode(Path(path).read_bytes(), source=path)
    except OSError as exc:
        return f"{path}: cannot read: {exc.strerror or exc}"
    except CheckpointError as exc:
        return str(exc)
    return data, stored, checksum(data)


def _checkpoint_show(args: argparse.Namespace) -> int:
    loaded = _load(args.file)
    if isinstance(loaded, str):
        print(f"devplug checkpoint show: {loaded}", file=sys.stderr)
        return 2
    data, stored, computed = loaded
    if args.json:
        print(json.dumps(checkpoint_as_dict(data, stored, computed), indent=2))
    else:
        print(format_checkpoint(args.file, data, stored, computed))
    return 0


def _checkpoint_verify(args: argparse.Namespace) -> int:
    loaded = _load(args.file)
    if isinstance(loaded, str):
        print(f"devplug checkpoint verify: {loaded}", file=sys.stderr)
        return 2
    _, stored, computed = loaded
    if stored != computed:
        print(f"{args.file}: checksum mismatch: stored {stored}, computed {computed}", file=sys.stderr)
        return 1
    print(f"{args.file}: checksum {stored} ok")
    return 0


def _add_checkpoint_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cp = sub.add_parser("checkpoint", help="inspect a kubelet_internal_checkpoint file")
    cps = cp.add_subparsers(dest="action", required=True)
    show = cps.add_parser("show", help="print the checkpoint readably, Allocate responses decoded")
    show.add_argument("file")
    show.add_argument("--json", action="store_true", help="print JSON instead of text")
    show.set_defaults(func=_checkpoint_show)
    verify = cps.add_parser("verify", help="exit 0 when the kubelet's checksum matches, 1 when not")
    verify.add_argument("file")
    verify.set_defaults(func=_checkpoint_verify)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="devplug", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_checkpoint_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
