"""What flightfeed imports when it is imported is what `pip install flightfeed` installs.

The suite runs with every extra installed, so a module-level import of a package that only an
extra brings passes here and fails for a user: `pip install -e ".[spark]"` (the README's first
command) could not import flightfeed at all while DuckDB was a test dependency. This reads the
imports instead: every third-party package a module imports at its top level must come with
the core dependencies (directly or through them), or, under `flightfeed/spark/`, with the
`spark` extra. Imports inside functions are lazy and not checked; imports under
`if TYPE_CHECKING:` never run.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from functools import cache
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "flightfeed"
EXTRA_OF_SUBPACKAGE = {"spark": "spark"}
"""Subpackages that may import what an extra brings (nothing else imports them)."""


def _pyproject() -> dict[str, object]:
    with (ROOT / "pyproject.toml").open("rb") as file:
        project: dict[str, object] = tomllib.load(file)["project"]
    return project


def _names(requirements: list[str]) -> set[str]:
    return {Requirement(text).name.lower().replace("_", "-") for text in requirements}


@cache
def _with_dependencies(distribution: str) -> frozenset[str]:
    """The distribution and everything it requires, transitively (extras' own not counted)."""
    found = {distribution}
    try:
        requires = metadata.requires(distribution) or []
    except metadata.PackageNotFoundError:
        return frozenset(found)
    for text in requires:
        requirement = Requirement(text)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue  # an extra of that distribution, or another platform's
        found |= _with_dependencies(requirement.name.lower().replace("_", "-"))
    return frozenset(found)


def _installed(names: set[str]) -> set[str]:
    out: set[str] = set()
    for name in names:
        out |= _with_dependencies(name)
    return out


def _top_level_imports(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(line, top-level module) of the imports a module runs when it is imported."""
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        nodes = ast.walk(node) if isinstance(node, ast.If | ast.Try) else [node]
        for inner in nodes:
            if isinstance(inner, ast.Import):
                for alias in inner.names:
                    yield inner.lineno, alias.name.split(".")[0]
            elif isinstance(inner, ast.ImportFrom) and inner.level == 0 and inner.module:
                yield inner.lineno, inner.module.split(".")[0]


@cache
def _providers() -> dict[str, list[str]]:
    """Top-level module → the installed distributions that provide it (scans them all)."""
    return dict(metadata.packages_distributions())


def _distributions(module: str) -> set[str]:
    return {d.lower().replace("_", "-") for d in _providers().get(module, [])}


def test_every_module_imports_only_what_its_install_brings() -> None:
    project = _pyproject()
    core = _installed(_names(project["dependencies"]))  # type: ignore[arg-type]
    extras: dict[str, list[str]] = project["optional-dependencies"]  # type: ignore[assignment]
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        extra = EXTRA_OF_SUBPACKAGE.get(relative.parts[0]) if len(relative.parts) > 1 else None
        allowed = core | (_installed(_names(extras[extra])) if extra else set())
        for line, module in _top_level_imports(ast.parse(path.read_text(), str(path))):
            if module in sys.stdlib_module_names or module in ("flightfeed", "__future__"):
                continue
            distributions = _distributions(module)
            assert distributions, f"{relative}:{line} imports {module}, which nothing installs"
            if not distributions & allowed:
                where = f"the {extra!r} extra" if extra else "the core dependencies"
                problems.append(f"flightfeed/{relative}:{line}: {module} is not in {where}")
    assert not problems, "\n".join(problems)


def test_the_check_sees_an_import_missing_from_the_core() -> None:
    """The test above can fail: an extra's package imported at the top level is caught."""
    project = _pyproject()
    core = _installed(_names(project["dependencies"]))  # type: ignore[arg-type]
    tree = ast.parse("import anyio\nif True:\n    import pyspark.sql\n")
    imported = {module for _, module in _top_level_imports(tree)}
    assert imported == {"anyio", "pyspark"}
    assert _distributions("pyspark")
    assert not _distributions("pyspark") & core
    assert _distributions("duckdb") & core  # a worker's tables: core since this test exists


@pytest.mark.parametrize("missing", ["pyspark", "sqlglot"])
def test_flightfeed_spark_without_its_extra_says_what_to_install(missing: str) -> None:
    """Run where the extra's package cannot be imported (None in sys.modules blocks it)."""
    program = f"import sys; sys.modules[{missing!r}] = None; import flightfeed.spark"
    out = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=False, timeout=60
    )
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError: flightfeed.spark needs the spark extra:")
    assert "pip install 'flightfeed[spark]'" in last
    assert missing in last
