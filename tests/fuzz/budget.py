"""The fuzzing budget shared by every test here: IBPOOL_FUZZ_EXAMPLES examples per test (default
50, so the whole folder runs in well under a minute), and a per-example deadline that catches a
decoder that hangs or goes quadratic on a small input."""

from __future__ import annotations

import os
from datetime import timedelta

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("IBPOOL_FUZZ_EXAMPLES", "50"))
# CI draws the same inputs every run (a red CI must be reproducible and caused by the change);
# a developer's run, or a longer hunt with IBPOOL_FUZZ_EXAMPLES, draws new ones each time.
DERANDOMIZE = os.environ.get("CI") == "true"
FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=DERANDOMIZE,
    deadline=timedelta(seconds=5),
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)

TRICKY_TOKENS = ["", "0", "-1", "[", "]", "[1-", "=", ",", "0x", "999999999999", "nan", "\x00", "é"]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)


@st.composite
def mutated(draw: st.DrawFn, valid: bytes) -> bytes:
    """`valid` with a few bytes flipped, deleted, inserted or a slice repeated: near-misses of good input."""
    data = bytearray(valid)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "delete", "insert", "repeat", "truncate"]))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if op == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "delete" and data:
            del data[at : at + draw(st.integers(1, 8))]
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif op == "repeat" and data:
            data[at:at] = data[at : at + draw(st.integers(1, 16))] * 2
        elif op == "truncate":
            del data[at:]
    return bytes(data)


@st.composite
def mutated_lines(draw: st.DrawFn, valid: str) -> str:
    """`valid` text with whole lines dropped, duplicated, swapped or one token replaced."""
    lines = valid.splitlines()
    for _ in range(draw(st.integers(1, 3))):
        if not lines:
            break
        at = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["drop", "duplicate", "swap", "token"]))
        if op == "drop":
            del lines[at]
        elif op == "duplicate":
            lines.insert(at, lines[at])
        elif op == "swap":
            other = draw(st.integers(0, len(lines) - 1))
            lines[at], lines[other] = lines[other], lines[at]
        else:
            tokens = lines[at].split(" ")
            i = draw(st.integers(0, len(tokens) - 1))
            tokens[i] = draw(st.text(max_size=12) | st.sampled_from(TRICKY_TOKENS))
            lines[at] = " ".join(tokens)
    return "\n".join(lines) + draw(st.sampled_from(["", "\n"]))
