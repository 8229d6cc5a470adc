"""`--tables pkg.module:attribute`: a Catalog, or a function of no arguments returning one;
anything else is an InvalidArgument saying what is wrong, never a traceback of the attempt."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from flightfeed.coordinator import Catalog
from flightfeed.coordinator.catalog import load_catalog
from flightfeed.errors import InvalidArgument

CATALOGS = """
from flightfeed.coordinator import Catalog

ready = Catalog()


def make():
    return Catalog()


def needs(name):
    return Catalog()


def broken():
    raise RuntimeError("no config file")


not_a_catalog = 42
"""


@pytest.fixture
def catalogs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    (tmp_path / "user_catalogs.py").write_text(CATALOGS)
    (tmp_path / "failing_catalogs.py").write_text("raise RuntimeError('bad settings')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "user_catalogs"
    for name in ("user_catalogs", "failing_catalogs"):
        sys.modules.pop(name, None)


def test_a_catalog_or_a_function_returning_one(catalogs: str) -> None:
    assert isinstance(load_catalog(f"{catalogs}:ready"), Catalog)
    assert isinstance(load_catalog(f"{catalogs}:make"), Catalog)


@pytest.mark.parametrize(
    ("attribute", "message"),
    [
        ("needs", "is a function that takes arguments"),
        ("broken", "calling it failed: RuntimeError('no config file')"),
        ("not_a_catalog", "is a int, not a Catalog"),
        ("missing", "has no 'missing'"),
    ],
)
def test_anything_else_is_a_clear_error(catalogs: str, attribute: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match="catalog 'user_catalogs:") as error:
        load_catalog(f"{catalogs}:{attribute}")
    assert message in str(error.value)


def test_a_module_that_fails_as_it_is_imported(catalogs: str) -> None:
    with pytest.raises(InvalidArgument) as error:
        load_catalog("failing_catalogs:catalog")
    assert "importing 'failing_catalogs' failed: RuntimeError('bad settings')" in str(error.value)
