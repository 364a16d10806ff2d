"""The mock's state parser under a sanitizer build (ASan + UBSan, leaks checked): >= 10,000 cases.

The cases are generated here, deterministically: valid documents, then byte-level mutations of them
with the inputs that broke the Python mock (issue 11.2: huge and negative numbers, NUL and overlong
UUIDs, non-UTF-8, deep nesting) mixed in. The driver (fuzz_state.c) parses each case, adopts the
accepted ones as the library's state and drains their events, as a plugin would.
"""

from __future__ import annotations

import json
import os
import random
import struct
import subprocess
from pathlib import Path

import pytest

from pytest_devplug.backends import mockstate
from pytest_devplug.nvml.build import SOURCE, find_compiler
from pytest_devplug.errors import CompilerNotFoundError

CASES = 12_000
TOKENS = [
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b'"',
    b"\\",
    b"\\u0000",
    b"\\ud800",
    b"\\udc00\\ud800",
    b"-",
    b"-0",
    b"1e999",
    b"0.5",
    b"18446744073709551629",
    b"18446744073709551615",
    b"4294967296",
    b"2147483648",
    b"-1",
    b"\xff",
    b"\xc0\x80",
    b"\xed\xa0\x80",
    b"\xf4\x90\x80\x80",
    b"null",
    b"true",
    b"false",
    b'"uuid"',
    b'"minor"',
    b'"xid"',
    b'"gpus"',
    b'"events"',
    b'"numa_node"',
    b'"lost"',
    b"[" * 40,
    b"{" * 40,
    b"G" * 200,
    b"\x00",
    b"\t\n ",
    b'"mig_enabled"',
    b'"mig_devices"',
    b'"profile"',
    b'"gi"',
    b'"7g.40gb"',
    b'"1g.5gb+me"',
    b'"1g.10gb"',
    b"15",
    b"14",
    b'"ecc"',
    b'"uncorrected"',
]


def _seeds(rng: random.Random) -> list[bytes]:
    docs = []
    migs = ([], ["1g.5gb"], ["1g.5gb", "2g.10gb", "3g.20gb"], ["7g.40gb"], ["1g.10gb", "1g.5gb+me", "4g.20gb"])
    for n in (0, 1, 4, 17, 2, 3):
        state = mockstate.initial_state(n, rng.choice((0, 1, 2)), rng.choice(migs) if n < 4 else ())
        for i in range(n):
            if rng.random() < 0.3:
                state = mockstate.with_xid(state, mockstate.gpu_uuid(i), rng.choice((13, 79, 48)))
            if rng.random() < 0.2:
                state = mockstate.with_ecc_error(state, mockstate.gpu_uuid(i))
            if rng.random() < 0.2:
                state = mockstate.with_lost(state, mockstate.gpu_uuid(i), True)
        docs.append(json.dumps(state).encode())
    return docs


def _mutate(rng: random.Random, doc: bytes) -> bytes:
    data = bytearray(doc)
    for _ in range(rng.randint(1, 6)):
        op = rng.random()
        pos = rng.randint(0, len(data))
        if op < 0.3 and data:
            data[min(pos, len(data) - 1)] = rng.randrange(256)
        elif op < 0.6:
            data[pos:pos] = rng.choice(TOKENS)
        elif op < 0.75:
            del data[pos : pos + rng.randint(1, 16)]
        elif op < 0.85:
            data = data[:pos]
        else:
            start = rng.randint(0, len(data))
            data[pos:pos] = data[start : start + rng.randint(1, 64)]
    return bytes(data)


def _cases() -> list[bytes]:
    rng = random.Random(20261201)
    seeds = _seeds(rng)
    cases = list(seeds)
    # A growing document: valid states whose events (Xids, ECC errors) append, so the apply path delivers them.
    state = mockstate.initial_state(3, 1)
    for i in range(50):
        uuid = mockstate.gpu_uuid(i % 3)
        state = mockstate.with_ecc_error(state, uuid) if i % 4 == 3 else mockstate.with_xid(state, uuid, 79)
        cases.append(json.dumps(state).encode())
    while len(cases) < CASES:
        cases.append(_mutate(rng, rng.choice(seeds)))
    return cases


@pytest.fixture(scope="module")
def fuzz_driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        cc = find_compiler()
    except CompilerNotFoundError as exc:  # the message says what to install
        pytest.skip(str(exc))
    out = tmp_path_factory.mktemp("fuzz") / "fuzz_state"
    driver = Path(__file__).with_name("fuzz_state.c")
    flags = ["-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]
    proc = subprocess.run(
        [*cc, *flags, "-Wall", "-Wextra", "-Werror", "-pthread", f"-I{SOURCE.parent}", "-o", str(out), str(driver)],
        capture_output=True,
        text=True,
    )
    if proc.returncode and "sanitize" in proc.stderr and "cannot find" in proc.stderr:
        pytest.skip(f"the C compiler has no sanitizer runtime (libasan/libubsan): {proc.stderr.strip()[-300:]}")
    assert proc.returncode == 0, proc.stderr
    return out


def test_parser_survives_fuzzing_under_sanitizers(fuzz_driver: Path, tmp_path: Path) -> None:
    cases = _cases()
    blob = tmp_path / "cases.bin"
    blob.write_bytes(b"".join(struct.pack("<I", len(c)) + c for c in cases))
    env = dict(
        os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:exitcode=86", UBSAN_OPTIONS="print_stacktrace=1"
    )
    proc = subprocess.run([str(fuzz_driver), str(blob)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr[-4000:]}"
    assert "ERROR: AddressSanitizer" not in proc.stderr and "runtime error" not in proc.stderr, proc.stderr[-4000:]
    assert "LeakSanitizer" not in proc.stderr, proc.stderr[-4000:]
    counts = dict(zip(proc.stdout.split()[::2], map(int, proc.stdout.split()[1::2]), strict=True))
    assert counts["cases"] == len(cases) >= 10_000
    assert 50 < counts["accepted"] < len(cases), f"mutations should mostly be refused, seeds accepted: {counts}"
