"""One bounded wait for everything that polls the cluster: tenacity underneath, the last value kept.

Every wait in fixtures and helpers goes through :func:`wait_for`, so each has a deadline and, when it
runs out, the caller gets what it saw last to put in its failure message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

import tenacity

__all__ = ["WaitTimeout", "wait_for"]

T = TypeVar("T")


class WaitTimeout(Exception, Generic[T]):
    """The condition did not hold within ``timeout``; ``last`` is the last value seen (or ``None``)."""

    def __init__(self, what: str, timeout: float, last: T | None, last_error: BaseException | None) -> None:
        detail = f"; last value: {last!r}" if last_error is None else f"; last error: {last_error!r}"
        super().__init__(f"timed out after {timeout:g}s waiting for {what}{detail}")
        self.what = what
        self.timeout = timeout
        self.last = last
        self.last_error = last_error


def wait_for(
    probe: Callable[[], T],
    ok: Callable[[T], bool],
    *,
    timeout: float,
    what: str,
    interval: float = 0.05,
    retry_on: tuple[type[BaseException], ...] = (),
) -> T:
    """Call ``probe`` until ``ok(value)`` or ``timeout`` seconds pass; return the value that was ok.

    Exceptions in ``retry_on`` count as "not yet" (e.g. a pod not created yet); others propagate.
    Raises :class:`WaitTimeout` carrying the last value.
    """
    last: list[T] = []
    last_error: list[BaseException] = []

    def attempt() -> T:
        try:
            value = probe()
        except retry_on as exc:
            last_error[:] = [exc]
            raise
        last_error.clear()
        last[:] = [value]
        return value

    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_delay(timeout),
        wait=tenacity.wait_exponential(multiplier=interval, max=max(interval, 0.5)),
        retry=tenacity.retry_if_exception_type(retry_on) | tenacity.retry_if_result(lambda v: not ok(v)),
        reraise=False,
    )
    try:
        return retrying(attempt)
    except tenacity.RetryError:
        raise WaitTimeout(what, timeout, last[0] if last else None, last_error[0] if last_error else None) from None
