"""Kubernetes resource quantities (``resource.Quantity``): parsing and the canonical form, exactly.

One parser for every reader: the embedded API server validates and canonicalises pods with it, the scheduler and
the kubelet count requests with it, and the handles read a node's capacity with it (a real API server writes
1000 devices as ``"1k"``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from pytest_devplug.errors import QuantityError

__all__ = ["QUANTITY_REGEX_TEXT", "Quantity", "parse_quantity"]

QUANTITY_REGEX_TEXT = "^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
_QUANTITY_RE = re.compile(r"([+-]?)([0-9]+\.?[0-9]*|\.[0-9]+)([eEinumkKMGTP]*[-+]?[0-9]*)")
_DECIMAL_SUFFIX = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_SUFFIX = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_BY_EXP = {v: k for k, v in _DECIMAL_SUFFIX.items()}
_BINARY_BY_EXP = {v: k for k, v in _BINARY_SUFFIX.items()}


@dataclass(frozen=True)
class Quantity:
    """A ``resource.Quantity``: exact value plus the format its canonical string is written in."""

    value: Fraction
    fmt: str  # "DecimalSI" | "BinarySI" | "DecimalExponent"

    def is_integer(self) -> bool:
        # Upstream: value.MilliValue() % 1000 != 0 (MilliValue rounds up to whole milli-units).
        milli = -((-self.value * 1000) // 1)
        return milli % 1000 == 0

    def ceil_int(self) -> int:
        return int(-((-self.value) // 1))

    def milli(self) -> int:
        return int(-((-self.value * 1000) // 1))

    def __str__(self) -> str:
        return _canonical(self.value, self.fmt)


def parse_quantity(raw: object) -> Quantity:
    """Parse a quantity (a string, or an int or float as JSON gives it) as ``Quantity.UnmarshalJSON`` does.

    It trims white space from the raw JSON text between the quotes, and the Python client sends that text through
    ``json.dumps``: a space survives as a space (and is trimmed), while a newline or tab arrives as the escape
    ``\\n``, which is not a quantity. Raises :class:`QuantityError` (a ``ValueError``) naming the input.
    """
    if isinstance(raw, bool):
        raise QuantityError(raw, QUANTITY_REGEX_TEXT)
    if isinstance(raw, int):
        return Quantity(Fraction(raw), "DecimalSI")
    if isinstance(raw, float):
        return parse_quantity(repr(raw))
    if not isinstance(raw, str):
        raise QuantityError(raw, QUANTITY_REGEX_TEXT)
    m = _QUANTITY_RE.fullmatch(raw.strip(" "))
    if not m:
        raise QuantityError(raw, QUANTITY_REGEX_TEXT)
    sign, digits, suffix = m.groups()
    number = Fraction(digits)
    if sign == "-":
        number = -number
    if suffix in _DECIMAL_SUFFIX:
        return Quantity(number * Fraction(10) ** _DECIMAL_SUFFIX[suffix], "DecimalSI")
    if suffix in _BINARY_SUFFIX:
        return Quantity(number * 2 ** _BINARY_SUFFIX[suffix], "BinarySI")
    em = re.fullmatch(r"[eE]([-+]?[0-9]+)", suffix)
    if em:
        return Quantity(number * Fraction(10) ** int(em.group(1)), "DecimalExponent")
    raise QuantityError(raw, QUANTITY_REGEX_TEXT)


def _canonical(value: Fraction, fmt: str) -> str:
    """``Quantity.String()``: the canonical form (e.g. ``0.5`` -> ``500m``, ``2000`` -> ``2k``)."""
    if value == 0:
        return "0"
    if fmt == "BinarySI" and (value <= -1024 or value >= 1024) and value.denominator == 1:
        n, exp = int(value), 0
        while exp < 60 and n % 1024 == 0:
            n //= 1024
            exp += 10
        return f"{n}{_BINARY_BY_EXP[exp]}"
    # Decimal: round up to nano units, then the largest exponent (multiple of 3) keeping an integer.
    nanos = -((-value * 10**9) // 1)
    mantissa, exp = int(nanos), -9
    while exp < 18 and mantissa % 1000 == 0:
        mantissa //= 1000
        exp += 3
    if fmt == "DecimalExponent":
        return f"{mantissa}e{exp}" if exp else str(mantissa)
    return f"{mantissa}{_DECIMAL_BY_EXP[exp]}"
