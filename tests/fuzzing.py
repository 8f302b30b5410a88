"""Helpers of the property tests: the input counter the ``make fuzz`` summary reads, and strategies shared by the
targets (MessagePack-able values, node messages built from real simulator output and then broken)."""

from __future__ import annotations

import inspect
from typing import Any

from hypothesis import strategies as st

from tests import conftest


def count() -> None:
    """Count one input of the calling property test (named after the test function)."""
    frame = inspect.currentframe()
    caller = frame.f_back if frame is not None else None
    conftest.INPUTS[caller.f_code.co_name if caller is not None else "?"] += 1


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
        st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=12) | st.binary(max_size=4), inner, max_size=6)
    ),
    max_leaves=25,
)
