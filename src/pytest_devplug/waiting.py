"""One bounded wait for everything that polls the cluster: tenacity underneath, the last value kept.

Every wait in fixtures and helpers goes through :func:`wait_for`, so each has a deadline and, when it
runs out, the caller gets what it saw last to put in its failure message. A wait whose state can no
longer come (the pod reached a terminal phase, the plugin crash-loops or was stopped, the kubelet refused
the registration) stops at once through ``give_up``, with the reason, instead of sitting out its timeout;
a plugin the kubelet is about to restart is no such reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import tenacity

from .errors import WaitAbandoned, WaitTimeout

__all__ = ["wait_for"]

T = TypeVar("T")


def wait_for(
    probe: Callable[[], T],
    ok: Callable[[T], bool],
    *,
    timeout: float,
    what: str,
    interval: float = 0.05,
    retry_on: tuple[type[BaseException], ...] = (),
    give_up: Callable[[], str | None] | None = None,
) -> T:
    """Call ``probe`` until ``ok(value)`` or ``timeout`` seconds pass; return the value that was ok.

    Exceptions in ``retry_on`` count as "not yet" (e.g. a pod not created yet); others propagate.
    Raises :class:`WaitTimeout` carrying the last value; :class:`WaitAbandoned` (a ``WaitTimeout``) as
    soon as ``give_up()``, asked after each value that is not ok, returns a reason.
    """
    last: list[T] = []
    last_error: list[BaseException] = []
    started = time.monotonic()

    def attempt() -> T:
        try:
            value = probe()
        except retry_on as exc:
            last_error[:] = [exc]
            raise
        last_error.clear()
        last[:] = [value]
        if give_up is not None and not ok(value):
            reason = give_up()
            if reason is not None:
                raise WaitAbandoned(what, time.monotonic() - started, value, reason)
        return value

    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_delay(timeout),
        wait=tenacity.wait_exponential(multiplier=interval, max=max(interval, 0.5)),
        retry=tenacity.retry_if_exception(lambda e: isinstance(e, retry_on) and not isinstance(e, WaitAbandoned))
        | tenacity.retry_if_result(lambda v: not ok(v)),
        reraise=False,
    )
    try:
        return retrying(attempt)
    except tenacity.RetryError:
        raise WaitTimeout(what, timeout, last[0] if last else None, last_error[0] if last_error else None) from None
