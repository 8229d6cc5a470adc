"""Table options, by HoraeDB's names: `ttl` and `enable_ttl` (rows older than the TTL are not
read and are purged), `update_mode` (OVERWRITE: a row replaces the row of the same primary
key; APPEND: every row is kept). Unknown options and bad values are refused, not ignored.

Unlike HoraeDB (a 7-day TTL unless told otherwise), a table keeps its rows until a `ttl` is set:
losing data by default is the wrong surprise for a pipeline's results. So a table's first `ttl`
turns the TTL on; from then on `ttl` and `enable_ttl` change independently, as in HoraeDB:
`enable_ttl=false` keeps the ttl (and a ttl sent with it) for `enable_ttl=true` to take up again,
and a new ttl leaves a disabled TTL disabled.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from ..errors import InvalidArgument

UpdateMode = Literal["OVERWRITE", "APPEND"]
_UNITS: Final = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION: Final = re.compile(r"^(\d{1,12})(ms|s|m|h|d)$")
KNOWN: Final = ("enable_ttl", "ttl", "update_mode")


MAX_DURATION_MS: Final = 10**15
"""About 31,700 years: a TTL longer than that is no limit a table's timestamps could reach (and
now minus one much longer is no timestamp a table can compare with)."""


def parse_duration_ms(text: str) -> int:
    """'7d', '12h', '30m', '10s', '250ms' in milliseconds."""
    match = _DURATION.match(text.strip())
    if match is None:
        raise InvalidArgument(f"bad duration {text!r}: a number and one of {list(_UNITS)}")
    ms = int(match[1]) * _UNITS[match[2]]
    if ms > MAX_DURATION_MS:
        raise InvalidArgument(
            f"duration {text!r} is past {MAX_DURATION_MS} ms (about 31,700 years): to keep rows"
            " for ever, set enable_ttl=false"
        )
    return ms


def _parse_bool(name: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered not in ("true", "false"):
        raise InvalidArgument(f"table option {name} must be true or false, got {text!r}")
    return lowered == "true"


@dataclass(frozen=True)
class TableOptions:
    ttl_ms: int | None = None
    """Rows whose timestamp is older than now minus this are gone; None: kept for ever."""
    update_mode: UpdateMode = "OVERWRITE"
    disabled_ttl_ms: int | None = None
    """The ttl kept while enable_ttl=false (ttl_ms is then None): HoraeDB keeps it."""

    def __post_init__(self) -> None:
        if self.ttl_ms is not None and self.disabled_ttl_ms is not None:
            raise InvalidArgument("a TTL is either in effect (ttl_ms) or disabled, not both")

    @classmethod
    def parse(cls, options: Mapping[str, str], base: TableOptions | None = None) -> TableOptions:
        """`options` over `base` (a new table's defaults when None)."""
        unknown = sorted(set(options) - set(KNOWN))
        if unknown:
            raise InvalidArgument(f"unknown table option(s) {unknown}; known: {list(KNOWN)}")
        current = base or cls()
        enabled = current.ttl_ms is not None
        ttl = current.ttl_ms if enabled else current.disabled_ttl_ms
        if "ttl" in options:
            if ttl is None:
                enabled = True  # the table's first ttl (see the module's docstring)
            ttl = parse_duration_ms(options["ttl"])
            if ttl == 0:
                raise InvalidArgument("ttl must be positive (enable_ttl=false keeps every row)")
        if "enable_ttl" in options:
            enabled = _parse_bool("enable_ttl", options["enable_ttl"])
            if enabled and ttl is None:
                raise InvalidArgument(
                    "enable_ttl=true needs a ttl: the table has none (no default here): send"
                    " one with it, as ttl=7d"
                )
        mode = options.get("update_mode", current.update_mode).strip().upper()
        if mode not in ("OVERWRITE", "APPEND"):
            raise InvalidArgument(f"update_mode must be OVERWRITE or APPEND, got {mode!r}")
        if base is not None and mode != base.update_mode:
            raise InvalidArgument(
                f"a table's update_mode cannot change ({base.update_mode} → {mode}):"
                " it decides how rows are stored"
            )
        return cls(
            ttl_ms=ttl if enabled else None,
            update_mode=mode,  # type: ignore[arg-type]
            disabled_ttl_ms=None if enabled else ttl,
        )

    def as_strings(self) -> dict[str, str]:
        """The options by HoraeDB's names, as `parse` reads them back."""
        enabled = "true" if self.ttl_ms is not None else "false"
        strings = {"update_mode": self.update_mode, "enable_ttl": enabled}
        ttl = self.ttl_ms if self.ttl_ms is not None else self.disabled_ttl_ms
        if ttl is not None:
            strings["ttl"] = _format_duration(ttl)
        return strings


def _format_duration(ms: int) -> str:
    for unit in ("d", "h", "m", "s"):
        if ms % _UNITS[unit] == 0:
            return f"{ms // _UNITS[unit]}{unit}"
    return f"{ms}ms"


__all__ = ["KNOWN", "TableOptions", "UpdateMode", "parse_duration_ms"]
