"""The examples refuse bad arguments in their parser, in one line, before Spark or any worker
starts (`--workers 0` was an InvalidArgument traceback from the cluster, after start-up)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
QUERY = "SELECT count(*) AS cnt, task FROM scan(2, '3,1', '2', '4', '1,1') GROUP BY task"


def example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("name", "argv", "message"),
    [
        ("work_unit_feed", ["--workers", "0", QUERY], "argument --workers: must be 1 or more"),
        ("work_unit_feed", ["--workers", "two", QUERY], "must be a whole number, got 'two'"),
        ("streaming_scan", ["--workers", "0"], "argument --workers: must be 1 or more"),
        ("streaming_scan", ["--args", "[2, '3,1']"], "argument --args: not JSON"),
        ("streaming_scan", ["--args", '{"task_count": 2}'], "argument --args: not a JSON list"),
        ("streaming_scan", ["--chunk-delay", "-1"], "must be 0 or more seconds, got -1"),
    ],
)
def test_bad_arguments_are_one_parser_error(
    name: str, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        example(name).main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err
