"""Filling ``{name}`` placeholders in a command, shared by :class:`~.base.PluginSpec` and :class:`~.dra.DriverSpec`.

A module of its own because ``base`` imports ``dra`` (the backend protocol names its DRA side), so ``dra`` cannot
take it from ``base``.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence

__all__ = ["fill_placeholders"]


def fill_placeholders(
    argv: Sequence[str], env: Mapping[str, str], values: Mapping[str, str]
) -> tuple[list[str], dict[str, str]]:
    """``argv`` and ``env``'s values with each ``{name}`` of ``values`` (and ``{python}``: this interpreter) put in, in
    one pass: a value is never filled again, other braces stay as written. What :meth:`~.base.PluginSpec.command` and
    :meth:`~.dra.DriverSpec.command` share."""
    values = {"python": sys.executable, **values}
    pattern = re.compile(r"\{(" + "|".join(map(re.escape, values)) + r")\}")

    def fill(text: str) -> str:
        return pattern.sub(lambda m: values[m.group(1)], text)

    return [fill(a) for a in argv], {k: fill(v) for k, v in env.items()}
