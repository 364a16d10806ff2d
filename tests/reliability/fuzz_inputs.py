"""Hypothesis strategies for checkpoint files: mostly checkpoint-shaped JSON with hostile details
(case-folded and repeated keys, nulls, odd numbers, surrogate escapes, invalid UTF-8, BOMs,
control characters, deep nesting, truncation), since random bytes rarely get past the first byte."""

from __future__ import annotations

import base64
import json

from hypothesis import strategies as st

_WS = st.sampled_from([b"", b"", b"", b" ", b"\n", b"\t", b"\r\n  "])

_ODD_NUMBERS = [
    b"0",
    b"1",
    b"-1",
    b"-0",
    b"01",
    b"1.0",
    b"1e2",
    b"1E+2",
    b"1.",
    b".5",
    b"-",
    b"+1",
    b"0x10",
    b"NaN",
    b"Infinity",
    b"-Infinity",
    b"4294967295",
    b"4294967296",
    b"18446744073709551615",
    b"18446744073709551616",
    b"9" * 30,
    b"1e999",
    b"-9223372036854775808",
]
_ODD_STRING_PARTS = [
    b"\\ud800",
    b"\\udc00",
    b"\\ud83d\\ude00",
    b"\\ud800\\u0041",
    b"\\u0000",
    b"\\u001b[31m",
    b"\\n",
    b"\\/",
    b"\\x41",
    b"\\u12",
    b"\xff",
    b"\xe2\x82",
    b"\xed\xa0\x80",
    b"\xc0\xaf",
    b"\t",
    b"\x1b",
    b"\xe2\x80\xae",
    b"\xef\xbb\xbf",
    b"<&>",
    b"\\u2028",
    b"\xe2\x80\xa8",
    b"\xc5\xbf",
    b"\xe2\x84\xaa",
]
_KEYS = [
    "Data",
    "Checksum",
    "PodDeviceEntries",
    "RegisteredDevices",
    "PodUID",
    "ContainerName",
    "ResourceName",
    "DeviceIDs",
    "AllocResp",
    "data",
    "CHECKSUM",
    "Checkſum",
    "podUid",
    "deviceids",
    "X",
    "",
]
_NUMA_KEYS = ["0", "1", "-1", " 1", "+1", "01", "1_0", "9223372036854775807", "9223372036854775808", "x", ""]


def _string_from_text(text: str) -> bytes:
    return json.dumps(text, ensure_ascii=False).encode("utf-8", "surrogatepass")


json_strings = st.one_of(
    st.text(max_size=12).map(_string_from_text),
    st.lists(
        st.one_of(st.sampled_from(_ODD_STRING_PARTS), st.text(max_size=4).map(lambda t: _string_from_text(t)[1:-1])),
        max_size=4,
    ).map(lambda parts: b'"' + b"".join(parts) + b'"'),
)
numbers = st.one_of(st.sampled_from(_ODD_NUMBERS), st.integers(-(2**70), 2**70).map(lambda i: str(i).encode()))
scalars = st.one_of(st.sampled_from([b"null", b"true", b"false", b"nul", b"True"]), numbers, json_strings)


def _array(items: list[bytes]) -> bytes:
    return b"[" + b",".join(items) + b"]"


def _object(members: list[tuple[bytes, bytes]]) -> bytes:
    return b"{" + b",".join(k + b":" + v for k, v in members) + b"}"


def _key(names: list[str]) -> st.SearchStrategy[bytes]:
    return st.one_of(st.sampled_from(names).map(_string_from_text), json_strings)


any_value = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4).map(_array),
        st.lists(st.tuples(_key(_KEYS), inner), max_size=4).map(_object),
    ),
    max_leaves=12,
)
string_lists = st.one_of(
    st.just(b"null"), st.lists(st.one_of(json_strings, st.just(b"null")), max_size=3).map(_array), any_value
)
alloc_resps = st.one_of(
    st.binary(max_size=24).map(lambda b: b'"' + base64.b64encode(b) + b'"'),
    st.sampled_from(
        [b'"AQ==="', b'"AQ"', b'"A==="', b'"AQ\\nI="', b'"%%"', b"[1,2,255]", b"[256]", b"[-1]", b"[null]"]
    ),
    any_value,
)
numa_maps = st.one_of(st.lists(st.tuples(_key(_NUMA_KEYS), string_lists), max_size=3).map(_object), any_value)
entries = st.lists(
    st.one_of(
        st.tuples(_key(["PodUID", "ContainerName", "ResourceName"]), json_strings),
        st.tuples(_key(["DeviceIDs", "deviceIDs"]), numa_maps),
        st.tuples(_key(["AllocResp"]), alloc_resps),
        st.tuples(_key(_KEYS), any_value),
    ),
    max_size=6,
).map(_object)
registered = st.one_of(st.lists(st.tuples(json_strings, string_lists), max_size=3).map(_object), any_value)
datas = st.one_of(
    st.lists(
        st.one_of(
            st.tuples(_key(["PodDeviceEntries"]), st.one_of(st.lists(entries, max_size=3).map(_array), any_value)),
            st.tuples(_key(["RegisteredDevices"]), registered),
            st.tuples(_key(_KEYS), any_value),
        ),
        max_size=4,
    ).map(_object),
    any_value,
)
documents = st.one_of(
    st.lists(
        st.one_of(
            st.tuples(_key(["Data", "data"]), datas),
            st.tuples(_key(["Checksum", "checksum"]), numbers),
            st.tuples(_key(_KEYS), any_value),
        ),
        max_size=4,
    ).map(_object),
    any_value,
)


@st.composite
def checkpoint_files(draw: st.DrawFn) -> bytes:
    """A checkpoint-shaped document, sometimes damaged the way files get damaged."""
    blob = draw(documents)
    blob = draw(_WS) + blob + draw(_WS)
    damage = draw(st.sampled_from(["none"] * 6 + ["truncate", "bom", "utf16", "garbage", "deep", "flip"]))
    if damage == "truncate" and blob:
        blob = blob[: draw(st.integers(0, len(blob) - 1))]
    elif damage == "bom":
        blob = b"\xef\xbb\xbf" + blob
    elif damage == "utf16":
        blob = blob.decode("utf-8", "replace").encode(draw(st.sampled_from(["utf-16", "utf-16-le", "utf-32"])))
    elif damage == "garbage":
        blob += draw(st.binary(min_size=1, max_size=4))
    elif damage == "deep":
        depth = draw(st.sampled_from([500, 1000, 9999, 10000, 20000]))
        blob = b'{"X":' + b"[" * depth + b"]" * depth + b',"Data":' + blob + b"}"
    elif damage == "flip" and blob:
        i = draw(st.integers(0, len(blob) - 1))
        blob = blob[:i] + bytes([draw(st.integers(0, 255))]) + blob[i + 1 :]
    return blob
