"""DataFusion's `upper` and `lower` in Arrow: Unicode's full case mapping, as Rust's
`to_uppercase` and `to_lowercase` do it.

Arrow's `utf8_upper` and `utf8_lower` map one character to one: 'straße' became 'STRAẞE' where
DataFusion gives 'STRASSE', 'ﬁ' stayed 'ﬁ' (DataFusion: 'FI'), 'İ' lowered to 'i' (DataFusion:
'i̇'). A HoraeDB node plans its pushed predicates as exact, so `upper(host) = 'STRASSE'` lost
the row. The characters whose full mapping is longer than one (Unicode's SpecialCasing, a
hundred or so) are replaced by it first, in the batches that hold one (one regex pass tells);
Arrow maps the rest. DataFusion lowers a capital sigma by its place in a word (a medial sigma
inside, a final one at the end): a `lower` over a value holding one is refused rather than
guessed.
"""

from __future__ import annotations

import functools
import re
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import InvalidArgument
from ..plan.functions import ScalarUdf

CAPITAL_SIGMA: Final = "Σ"
_BASIC_PLANE: Final = 0x10000
"""SpecialCasing's unconditional mappings are all in the Basic Multilingual Plane."""


@functools.cache
def _longer_mappings(upper: bool) -> tuple[dict[str, str], str]:
    """The characters whose full mapping has more than one character (Python's str methods
    apply Unicode's SpecialCasing, as Rust's do), and a regex class matching any of them."""
    mapped = {}
    for code in range(_BASIC_PLANE):
        char = chr(code)
        full = char.upper() if upper else char.lower()
        if len(full) > 1:
            mapped[char] = full
    return mapped, "[" + "".join(re.escape(c) for c in mapped) + "]"


def _full_case(values: pa.Array, upper: bool) -> pa.Array:
    mapped, any_of = _longer_mappings(upper)
    if pc.any(pc.match_substring_regex(values, any_of)).as_py():
        for char, full in mapped.items():
            values = pc.replace_substring(values, char, full)
    return pc.utf8_upper(values) if upper else pc.utf8_lower(values)


def _upper(values: pa.Array) -> pa.Array:
    return _full_case(values, upper=True)


def _lower(values: pa.Array) -> pa.Array:
    if pc.any(pc.match_substring(values, CAPITAL_SIGMA)).as_py():
        raise InvalidArgument(
            "DataFusion's lower turns a capital sigma ('Σ') into a medial or, at the end of a"
            " word, a final sigma, which this worker does not evaluate: a predicate with lower()"
            " over a value holding 'Σ' is refused"
        )
    return _full_case(values, upper=False)


UPPER: Final = ScalarUdf("datafusion_upper", _upper, pa.string())
LOWER: Final = ScalarUdf("datafusion_lower", _lower, pa.string())
"""The functions a translated `upper` and `lower` call (the table engine's reads resolve
them, as datafusion_floats.SIGNBIT)."""
