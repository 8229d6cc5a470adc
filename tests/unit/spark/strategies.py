"""Hypothesis strategies shared by the flightfeed.spark tests."""

from __future__ import annotations

from hypothesis import strategies as st

table_arguments = st.lists(
    st.one_of(
        st.booleans(),
        st.integers(-(2**63), 2**63 - 1),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(),
    ),
    max_size=5,
)
"""Arguments of a catalog table call: what both SQL literals and JSON options carry."""
