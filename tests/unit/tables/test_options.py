"""TableOptions: HoraeDB's option names parsed strictly (unknown names and bad values refused),
update_mode fixed once a table exists, and as_strings read back by parse."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flightfeed.errors import InvalidArgument
from flightfeed.tables.options import KNOWN, TableOptions, parse_duration_ms

DAY = 86_400_000
HOUR = 3_600_000


def test_the_defaults_keep_rows_for_ever_and_overwrite() -> None:
    assert TableOptions.parse({}) == TableOptions(ttl_ms=None, update_mode="OVERWRITE")
    assert TableOptions() == TableOptions.parse({})


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("250ms", 250),
        ("10s", 10_000),
        ("30m", 1_800_000),
        ("12h", 43_200_000),
        ("7d", 7 * DAY),
        (" 1d ", DAY),
        ("0ms", 0),
        ("11574074d", 11_574_074 * DAY),
    ],
)
def test_durations_parse_to_milliseconds(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize(
    "text", ["", "7", "d", "7w", "1.5h", "-1d", "1 d", "7D", "1e3s", "1000000000000d", "7d7h"]
)
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(InvalidArgument, match="bad duration"):
        parse_duration_ms(text)


@pytest.mark.parametrize("text", ["7w", "abc", "-5m", "1.5d", ""])
def test_a_bad_ttl_is_refused(text: str) -> None:
    with pytest.raises(InvalidArgument, match="bad duration"):
        TableOptions.parse({"ttl": text})


def test_a_zero_ttl_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="ttl must be positive"):
        TableOptions.parse({"ttl": "0s"})


def test_a_ttl_alone_enables_it() -> None:
    assert TableOptions.parse({"ttl": "7d"}).ttl_ms == 7 * DAY
    assert TableOptions.parse({"ttl": "2h", "enable_ttl": "true"}).ttl_ms == 7_200_000
    assert TableOptions.parse({"ttl": "2h", "enable_ttl": " TRUE "}).ttl_ms == 7_200_000


def test_enable_ttl_false_disables_it_whatever_the_ttl() -> None:
    assert TableOptions.parse({"ttl": "7d", "enable_ttl": "false"}).ttl_ms is None
    assert TableOptions.parse({"enable_ttl": "False"}).ttl_ms is None
    base = TableOptions(ttl_ms=DAY)
    assert TableOptions.parse({"enable_ttl": "false"}, base).ttl_ms is None


def test_enable_ttl_false_keeps_the_ttl_for_enable_ttl_true() -> None:
    """HoraeDB's ttl and enable_ttl are independent options: disabling the TTL kept no ttl
    here, so enable_ttl=true alone was refused after it ('needs a ttl'), and a ttl sent with
    enable_ttl=false was answered OK and dropped."""
    base = TableOptions.parse({"ttl": "2h"})
    disabled = TableOptions.parse({"enable_ttl": "false"}, base)
    assert (disabled.ttl_ms, disabled.disabled_ttl_ms) == (None, 2 * HOUR)
    assert disabled.as_strings() == {"update_mode": "OVERWRITE", "enable_ttl": "false", "ttl": "2h"}
    assert TableOptions.parse({"enable_ttl": "true"}, disabled) == base
    sent = TableOptions.parse({"ttl": "3h", "enable_ttl": "false"}, base)
    assert (sent.ttl_ms, sent.disabled_ttl_ms) == (None, 3 * HOUR)
    assert TableOptions.parse({"enable_ttl": "true"}, sent).ttl_ms == 3 * HOUR
    assert TableOptions.parse(sent.as_strings()) == sent  # as a worker reads it back


def test_a_new_ttl_leaves_a_disabled_ttl_disabled() -> None:
    """As in HoraeDB; only a table's first ttl turns the TTL on (it had none in effect)."""
    disabled = TableOptions.parse({"ttl": "2h", "enable_ttl": "false"})
    assert disabled.disabled_ttl_ms == 2 * HOUR
    changed = TableOptions.parse({"ttl": "5h"}, disabled)
    assert (changed.ttl_ms, changed.disabled_ttl_ms) == (None, 5 * HOUR)
    assert TableOptions.parse({"ttl": "5h"}, TableOptions()).ttl_ms == 5 * HOUR


def test_enable_ttl_true_needs_a_ttl() -> None:
    with pytest.raises(InvalidArgument, match="enable_ttl=true needs a ttl"):
        TableOptions.parse({"enable_ttl": "true"})
    # the base's ttl is enough
    assert TableOptions.parse({"enable_ttl": "true"}, TableOptions(ttl_ms=5)).ttl_ms == 5


@pytest.mark.parametrize("text", ["yes", "1", "", "on", "t"])
def test_enable_ttl_must_be_true_or_false(text: str) -> None:
    with pytest.raises(InvalidArgument, match="enable_ttl must be true or false"):
        TableOptions.parse({"enable_ttl": text, "ttl": "1d"})


@pytest.mark.parametrize(
    ("text", "mode"),
    [
        ("OVERWRITE", "OVERWRITE"),
        ("append", "APPEND"),
        (" Append ", "APPEND"),
        ("overwrite", "OVERWRITE"),
    ],
)
def test_update_mode_parses_case_insensitively(text: str, mode: str) -> None:
    assert TableOptions.parse({"update_mode": text}).update_mode == mode


@pytest.mark.parametrize("text", ["UPSERT", "", "APPENDS"])
def test_a_bad_update_mode_is_refused(text: str) -> None:
    with pytest.raises(InvalidArgument, match="update_mode must be OVERWRITE or APPEND"):
        TableOptions.parse({"update_mode": text})


def test_an_unknown_option_is_refused_by_name() -> None:
    with pytest.raises(
        InvalidArgument, match=r"unknown table option\(s\) \['compaction'\]"
    ) as info:
        TableOptions.parse({"ttl": "1d", "compaction": "on"})
    for known in KNOWN:
        assert known in str(info.value)
    with pytest.raises(InvalidArgument, match=r"\['TTL', 'segment_duration'\]"):
        TableOptions.parse({"segment_duration": "2h", "TTL": "1d"})


def test_the_update_mode_cannot_change_once_the_table_exists() -> None:
    base = TableOptions(update_mode="APPEND")
    with pytest.raises(InvalidArgument, match="cannot change") as info:
        TableOptions.parse({"update_mode": "OVERWRITE"}, base)
    assert "APPEND" in str(info.value)
    assert "OVERWRITE" in str(info.value)
    with pytest.raises(InvalidArgument, match="cannot change"):
        TableOptions.parse({"update_mode": "append"}, TableOptions())
    # restating the same mode, or leaving it out, is fine
    assert TableOptions.parse({"update_mode": "append"}, base) == base
    assert TableOptions.parse({"ttl": "1h"}, base) == TableOptions(3_600_000, "APPEND")
    # with no base it is a new table: any mode
    assert TableOptions.parse({"update_mode": "APPEND"}).update_mode == "APPEND"


def test_parse_over_a_base_keeps_what_it_does_not_name() -> None:
    base = TableOptions(ttl_ms=DAY, update_mode="APPEND")
    assert TableOptions.parse({}, base) == base
    assert TableOptions.parse({"ttl": "2d"}, base) == TableOptions(2 * DAY, "APPEND")


def test_as_strings_names_every_option() -> None:
    assert TableOptions().as_strings() == {"update_mode": "OVERWRITE", "enable_ttl": "false"}
    assert TableOptions(ttl_ms=7 * DAY, update_mode="APPEND").as_strings() == {
        "update_mode": "APPEND",
        "enable_ttl": "true",
        "ttl": "7d",
    }
    assert TableOptions(ttl_ms=90_000).as_strings()["ttl"] == "90s"
    assert TableOptions(ttl_ms=1_500).as_strings()["ttl"] == "1500ms"
    assert TableOptions(ttl_ms=25 * 3_600_000).as_strings()["ttl"] == "25h"


def _options(ttl_ms: int | None, enabled: bool, update_mode: str) -> TableOptions:
    if enabled:
        return TableOptions(ttl_ms, update_mode)  # type: ignore[arg-type]
    return TableOptions(None, update_mode, disabled_ttl_ms=ttl_ms)  # type: ignore[arg-type]


OPTIONS = st.builds(
    _options,
    ttl_ms=st.none() | st.integers(1, 999_999_999_999),
    enabled=st.booleans(),
    update_mode=st.sampled_from(["OVERWRITE", "APPEND"]),
)
"""No TTL, one in effect, or one kept while disabled."""


@given(options=OPTIONS)
def test_as_strings_parses_back_to_the_same_options(options: TableOptions) -> None:
    assert TableOptions.parse(options.as_strings()) == options
    assert TableOptions.parse(options.as_strings(), options) == options


@given(options=OPTIONS, other=OPTIONS)
def test_as_strings_over_any_base_of_the_same_mode_gives_the_options(
    options: TableOptions, other: TableOptions
) -> None:
    """Whatever the base, the TTL in effect is the options'; so is the ttl kept, unless the
    options have none (enable_ttl=false alone keeps the base's, as HoraeDB does)."""
    base = replace(other, update_mode=options.update_mode)
    parsed = TableOptions.parse(options.as_strings(), base)
    if options.ttl_ms is not None or options.disabled_ttl_ms is not None:
        assert parsed == options
    else:
        assert parsed.ttl_ms is None
        assert parsed.disabled_ttl_ms == (base.ttl_ms or base.disabled_ttl_ms)


@pytest.mark.parametrize("text", ["999999999999d", "11574075d", "277777778h"])
def test_a_ttl_no_timestamp_could_reach_is_refused(text: str) -> None:
    """ttl=999999999999d was taken: every read of the table then failed on DuckDB's INT128 cast,
    and the TTL purge ended the worker."""
    with pytest.raises(InvalidArgument, match=r"about 31,700 years\): to keep rows for ever"):
        TableOptions.parse({"ttl": text})
    assert TableOptions.parse({"ttl": "11574074d"}).ttl_ms == 11574074 * 86_400_000
