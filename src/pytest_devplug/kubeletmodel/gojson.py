"""Go's ``encoding/json`` for the kubelet's files: a reader that accepts exactly what it accepts, and its output.

The kubelet reads its checkpoint with ``json.Unmarshal``; Python's ``json`` module is looser
(NaN, Infinity, UTF-16/32 and a UTF-8 BOM are accepted) and recursive (deep nesting raises
``RecursionError``). This parser is iterative, refuses what Go refuses and normalises strings the
way Go does: an invalid UTF-8 byte or an unpaired ``\\uD8xx`` escape becomes U+FFFD instead of an
error. It keeps every key of an object in order (duplicates included, as Go applies them in turn)
and numbers as their source text (Go converts them only once it knows the target type).
"""

from __future__ import annotations

import codecs
import json
import re
from dataclasses import dataclass
from typing import Union
from ..errors import GoJSONSyntaxError

__all__ = ["MAX_DEPTH", "Number", "Object", "Value", "field_name", "parse", "marshal"]

#: ``maxNestingDepth`` of Go's scanner: the 10001st open bracket is a syntax error.
MAX_DEPTH = 10000


@dataclass(frozen=True)
class Number:
    """A JSON number, kept as written."""

    text: str


@dataclass
class Object:
    """A JSON object: its members in document order, duplicates kept."""

    members: list[tuple[str, Value]]


Value = Union[None, bool, str, Number, list["Value"], Object]

_WS = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_STRING = re.compile(r'"(?:[^"\\\x00-\x1f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*"')
_SURROGATE = re.compile("[\ud800-\udfff]")
_LITERALS = (("true", True), ("false", False), ("null", None))


def _skip_ws(text: str, pos: int) -> int:
    m = _WS.match(text, pos)
    assert m is not None  # the pattern matches the empty string
    return m.end()


def _per_byte_replacement(err: UnicodeError) -> tuple[str, int]:
    # Go's utf8.DecodeRune reports each invalid byte on its own, so each becomes one U+FFFD;
    # Python's "replace" would merge a truncated sequence into a single U+FFFD.
    assert isinstance(err, UnicodeDecodeError)
    return "\ufffd", err.start + 1


codecs.register_error("pytest_devplug.go_utf8", _per_byte_replacement)


def _describe(text: str, pos: int) -> str:
    if pos >= len(text):
        return "unexpected end of JSON input"
    return f"invalid character {text[pos]!r} at offset {pos}"


def _string(text: str, pos: int) -> tuple[str, int]:
    m = _STRING.match(text, pos)
    if m is None:
        end = pos + 1
        while end < len(text) and text[end] != '"':
            if text[end] < " ":
                raise GoJSONSyntaxError(f"invalid character {text[end]!r} in string literal at offset {end}")
            end += 2 if text[end] == "\\" else 1
        if end >= len(text):
            raise GoJSONSyntaxError("unexpected end of JSON input (unterminated string)")
        raise GoJSONSyntaxError(f"invalid escape in string literal starting at offset {pos}")
    # The token is flat and validated, so json.loads cannot recurse or fail here.
    value: str = json.loads(m.group())
    return _SURROGATE.sub("\ufffd", value), m.end()


def _scalar(text: str, pos: int) -> tuple[Value, int]:
    c = text[pos] if pos < len(text) else ""
    if c == '"':
        return _string(text, pos)
    if c == "-" or c.isascii() and c.isdigit():
        m = _NUMBER.match(text, pos)
        if m is None:
            raise GoJSONSyntaxError(f"{_describe(text, pos + 1)} in numeric literal")
        return Number(m.group()), m.end()
    for word, value in _LITERALS:
        if text.startswith(word, pos):
            return value, pos + len(word)
    raise GoJSONSyntaxError(f"{_describe(text, pos)} looking for beginning of value")


def parse(blob: bytes) -> Value:
    """Parse ``blob`` (UTF-8, no BOM) as Go's ``json.Unmarshal`` does; raises :class:`GoJSONSyntaxError`."""
    text = blob.decode("utf-8", "pytest_devplug.go_utf8")
    n = len(text)
    # Open containers, innermost last; an object's pending key rides along with it.
    stack: list[tuple[list[Value] | Object, str | None]] = []
    pos = _skip_ws(text, 0)
    while True:
        # 1. Read one value; an opening bracket pushes a container and reads its first element.
        c = text[pos] if pos < n else ""
        value: Value
        if c and c in "[{":
            if len(stack) >= MAX_DEPTH:
                raise GoJSONSyntaxError(f"invalid character {c!r} at offset {pos}: exceeded max depth {MAX_DEPTH}")
            container: list[Value] | Object = [] if c == "[" else Object([])
            pos = _skip_ws(text, pos + 1)
            close = "]" if c == "[" else "}"
            if text.startswith(close, pos):
                value, pos = container, pos + 1
            elif isinstance(container, Object):
                key, pos = _member_key(text, pos)
                stack.append((container, key))
                continue
            else:
                stack.append((container, None))
                continue
        else:
            value, pos = _scalar(text, pos)
        # 2. Store it in its container; a closing bracket completes that container in turn.
        while True:
            if not stack:
                pos = _skip_ws(text, pos)
                if pos < n:
                    raise GoJSONSyntaxError(f"invalid character {text[pos]!r} after top-level value at offset {pos}")
                return value
            top, pending = stack[-1]
            if isinstance(top, Object):
                assert pending is not None
                top.members.append((pending, value))
            else:
                top.append(value)
            pos = _skip_ws(text, pos)
            c = text[pos] if pos < n else ""
            if c == ",":
                pos = _skip_ws(text, pos + 1)
                if isinstance(top, Object):
                    key, pos = _member_key(text, pos)
                    stack[-1] = (top, key)
                break
            close = "}" if isinstance(top, Object) else "]"
            if c != close:
                where = "after object key:value pair" if close == "}" else "after array element"
                raise GoJSONSyntaxError(f"{_describe(text, pos)} {where}")
            stack.pop()
            value, pos = top, pos + 1


def _member_key(text: str, pos: int) -> tuple[str, int]:
    """An object key and its colon; returns the key and where its value starts."""
    if not text.startswith('"', pos):
        raise GoJSONSyntaxError(f"{_describe(text, pos)} looking for beginning of object key string")
    key, end = _string(text, pos)
    end = _skip_ws(text, end)
    if not text.startswith(":", end):
        raise GoJSONSyntaxError(f"{_describe(text, end)} after object key")
    return key, _skip_ws(text, end + 1)


def field_name(key: str, fields: tuple[str, ...]) -> str | None:
    """The struct field (of ``fields``, Go's ASCII names) that ``json.Unmarshal`` fills from member ``key``: an exact
    match first, then a case-insensitive one; ``None``: ignored."""
    if key in fields:
        return key
    # bytes.EqualFold on ASCII field names: the only non-ASCII letters that fold onto them are U+017F (long s)
    # and U+212A (Kelvin sign)
    folded = key.lower().replace("\u017f", "s").replace("\u212a", "k")
    return next((f for f in fields if f.lower() == folded), None)


def marshal(value: object) -> str:
    """``json.Marshal``'s text of plain data: compact, UTF-8 kept; ``<``, ``>``, ``&`` escaped for HTML safety and
    U+2028/9 for JavaScript (map keys must already be in Go's order: sorted by their bytes)."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    for char, escape in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(char, escape)
    return text
