"""Every module imports only what docs/architecture.md allows its layer: the document's table
is the rule, so the code and its account cannot drift apart."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "flightfeed"
DOCUMENT = ROOT / "docs" / "architecture.md"
ANYTHING = "*"


def layer_rules() -> dict[str, set[str]]:
    """Layer → the layers it may import, read from the document's table."""
    rules: dict[str, set[str]] = {}
    in_table = False
    for line in DOCUMENT.read_text().splitlines():
        if line.startswith("| layer | owns | may import |"):
            in_table = True
            continue
        if not in_table or line.startswith("|---"):
            continue
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        layers = re.findall(r"`([^`]+)`", cells[0])
        allowed = set(re.findall(r"`([^`]+)`", cells[2]))
        if cells[2] == "anything":
            allowed = {ANYTHING}
        for layer in layers:
            rules[layer] = allowed
    return rules


def layer_of(dotted: str) -> str:
    """`flightfeed.plan.nodes.filter` → `plan`; `flightfeed._generated.arrow....` →
    `_generated.arrow`; `flightfeed.errors` → `errors`."""
    parts = dotted.split(".")[1:]
    if not parts:
        return "__init__"
    if parts[0] == "_generated" and len(parts) > 1:
        return f"_generated.{parts[1]}"
    return parts[0]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1] if len(parts) > 1 else parts
    return ".".join(parts)


def imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, imported flightfeed module) for every import of the file."""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "flightfeed":
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join([*base, *(node.module.split(".") if node.module else [])])
                if node.module is None:  # `from . import x`: x is a module of the package
                    for alias in node.names:
                        yield node.lineno, f"{target}.{alias.name}"
                    continue
                yield node.lineno, target
            elif node.module and node.module.split(".")[0] == "flightfeed":
                yield node.lineno, node.module


def allows(allowed: set[str], target: str) -> bool:
    return ANYTHING in allowed or any(
        target == rule or target.startswith(f"{rule}.") or rule.startswith(f"{target}.")
        for rule in allowed
    )


SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if "_generated" not in p.parts)


def test_the_document_names_every_layer_of_the_package() -> None:
    rules = layer_rules()
    found = {layer_of(module_name(path)) for path in SOURCES}
    assert found - set(rules) == set(), "layers missing from docs/architecture.md"
    assert set(rules) - found - {"_generated"} == set(), "the document names layers that are gone"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_respect_the_layers(path: Path) -> None:
    rules = layer_rules()
    own = layer_of(module_name(path))
    allowed = rules[own]
    violations = [
        f"{path.relative_to(ROOT)}:{line} imports {target} ({layer_of(target)})"
        for line, target in imports(path)
        if layer_of(target) != own and not allows(allowed, layer_of(target))
    ]
    assert not violations, f"{own} may import only {sorted(allowed)}: {violations}"


def test_the_checker_catches_a_forbidden_import(tmp_path: Path) -> None:
    """The rule bites: a coordinator module importing the worker is a violation."""
    rules = layer_rules()
    assert not allows(rules["coordinator"], layer_of("flightfeed.worker.server"))
    assert not allows(rules["flight"], layer_of("flightfeed._generated.flightfeed.v1"))
    assert allows(rules["flight"], layer_of("flightfeed._generated.arrow.flight.protocol"))
    assert not allows(rules["errors"], layer_of("flightfeed.flight"))
