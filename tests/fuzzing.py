"""Helpers of the property tests: the input counter the ``make fuzz`` summary reads, the strategies the targets
share (MessagePack-able values), and a fast seeded mutator.

Each example hypothesis draws (a structured input: random bytes, a random MessagePack value, a real message
broken at a random place) is tried as it is and as :data:`FANOUT` - 1 mutations of it made from a seed hypothesis
also draws (bytes flipped, cut short, a value anywhere in the message replaced by an edge case such as ``2**63``,
NaN, a map where a string belongs). Hypothesis explores and shrinks the examples; the mutator multiplies the inputs
each one costs, so ``make fuzz`` reaches 100,000 inputs per target in minutes on two cores. In the suite
``FANOUT`` is 3; ``make fuzz`` sets ``FUZZ_FANOUT``.
"""

from __future__ import annotations

import inspect
import os
import random
from collections.abc import Iterator
from typing import Any, Final

import msgpack
from hypothesis import strategies as st

from tests import conftest

FANOUT: Final = int(os.environ.get("FUZZ_FANOUT", "3"))


def count(n: int = 1, name: str | None = None) -> None:
    """Count ``n`` inputs of the calling property test (named after the test function, or ``name``)."""
    frame = inspect.currentframe()
    caller = frame.f_back if frame is not None else None
    conftest.INPUTS[name or (caller.f_code.co_name if caller is not None else "?")] += n


#: any value MessagePack carries: nil, bools, ints of every width, floats (NaN, infinities), strings, bytes,
#: and lists and maps of them
SCALARS: Any = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.binary(max_size=20)
)
VALUES: Any = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12) | st.binary(max_size=4), inner, max_size=5)
    ),
    max_leaves=12,
)
SEEDS: Any = st.integers(min_value=0, max_value=2**32 - 1)

#: values that broke decoders before, or are at a type's edge
_EDGES: Final[tuple[Any, ...]] = (
    None, True, False, 0, -1, 1, 2**31, 2**63 - 1, 2**63, 2**64 - 1, -(2**63), 1e308, -0.0, float("nan"),
    float("inf"), float("-inf"), "", "x" * 300, "GPU-\x00\n", b"", b"\xff" * 8, [], {}, {"xid": 79}, ["xid"],
    [[1, 2]], {b"k": 1}, {"": None},
)  # fmt: skip


def mutations(payload: bytes, seed: int) -> Iterator[bytes]:
    """``payload``, then FANOUT - 1 mutations of it (see the module docstring), all from ``seed``."""
    yield payload
    rng = random.Random(seed)
    try:
        decoded = msgpack.unpackb(payload, strict_map_key=False)
    except Exception:
        decoded = None
    for _ in range(FANOUT - 1):
        kind = rng.random()
        if decoded is not None and kind < 0.6:
            copy = msgpack.unpackb(payload, strict_map_key=False)
            yield msgpack.packb(_swap(rng, copy))
        elif kind < 0.8 and payload:
            data = bytearray(payload)
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            yield bytes(data)
        else:
            yield payload[: rng.randrange(len(payload) + 1)]


def _swap(rng: random.Random, obj: Any) -> Any:
    """``obj`` with one value somewhere in it replaced by an edge case (or a key renamed, or an item repeated)."""
    if not isinstance(obj, dict | list) or not obj or rng.random() < 0.15:
        return rng.choice(_EDGES)
    if isinstance(obj, dict):
        key = rng.choice(list(obj))
        roll = rng.random()
        if roll < 0.05:
            obj[rng.choice(("power_milliwatts", "memory_used_mib", "x", b"m"))] = obj.pop(key)
        elif roll < 0.1:
            del obj[key]
        else:
            obj[key] = _swap(rng, obj[key])
    else:
        i = rng.randrange(len(obj))
        if rng.random() < 0.05:
            obj.insert(i, obj[i])
        else:
            obj[i] = _swap(rng, obj[i])
    return obj


def text_mutations(text: str, seed: int) -> Iterator[str]:
    """``text``, then FANOUT - 1 mutations: characters inserted (quotes, braces, operators, digits, units,
    control characters), deleted or repeated."""
    yield text
    rng = random.Random(seed)
    alphabet = '"\\{},=~!.*+?()[]|^$ 0123456789smhdwun-\x00\n\u00e9'
    for _ in range(FANOUT - 1):
        chars = list(text)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(chars) + 1)
            roll = rng.random()
            if roll < 0.5:
                chars.insert(at, rng.choice(alphabet))
            elif roll < 0.75 and chars:
                del chars[min(at, len(chars) - 1)]
            elif chars:
                chars[at:at] = chars[max(0, at - 3) : at] * rng.randint(1, 5)
        yield "".join(chars)
