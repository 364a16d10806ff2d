"""Helpers both shipped conformance suites share (the device plugins' and the DRA drivers')."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from .errors import FaultNotSupportedError

__all__ = ["fault"]


@contextmanager
def fault(what: str, *, injector: str = "fault injector") -> Iterator[None]:
    """Run one call of the ``injector`` (as the skip names it); a fault it says it cannot make skips the check,
    saying which: the checks that do not need that fault still run."""
    try:
        yield
    except FaultNotSupportedError as exc:
        pytest.skip(f"the {injector} cannot {what}: {exc}")
