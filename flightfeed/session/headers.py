"""Request headers as a session builder sees them: case-insensitive, possibly repeated."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping


class Headers(Mapping[str, str]):
    """Immutable multi-valued headers. `h[name]` is the first value; `get_all` gives them all.

    Names are lowercased (HTTP/2 sends them so); iteration yields each name once, in order of
    first appearance.
    """

    __slots__ = ("_pairs", "_values")

    def __init__(self, items: Mapping[str, str] | Iterable[tuple[str, str]] = ()) -> None:
        pairs = list(items.items()) if isinstance(items, Mapping) else list(items)
        self._pairs: tuple[tuple[str, str], ...] = tuple((k.lower(), v) for k, v in pairs)
        values: dict[str, list[str]] = {}
        for key, value in self._pairs:
            values.setdefault(key, []).append(value)
        self._values = {k: tuple(v) for k, v in values.items()}

    def __getitem__(self, key: str) -> str:
        return self._values[key.lower()][0]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key.lower() in self._values

    def get_all(self, key: str) -> tuple[str, ...]:
        """Every value of `key`, in the order received (empty if absent)."""
        return self._values.get(key.lower(), ())

    def pairs(self) -> tuple[tuple[str, str], ...]:
        """All (name, value) pairs, repeats included, in the order received."""
        return self._pairs

    def __repr__(self) -> str:
        shown = [(k, "<hidden>" if k in _CREDENTIALS else v) for k, v in self._pairs]
        return f"Headers({shown!r})"


_CREDENTIALS = frozenset({"authorization", "proxy-authorization", "cookie"})
"""Headers whose values a repr never shows (a builder that logs its headers would log them)."""
