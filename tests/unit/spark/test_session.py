"""Getting Spark ready for flightfeed (flightfeed.spark.session) without starting Spark: finding
Java, registering the source on a session, and the check that Spark's Python workers import
this flightfeed version. The sessions here are stand-ins with only what the code calls."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest

import flightfeed.spark.session as session_module
from flightfeed._version import __version__
from flightfeed.errors import FlightfeedError, InvalidArgument
from flightfeed.spark.pushdown import FILTER_PUSHDOWN
from flightfeed.spark.session import (
    check_python_workers,
    java_runtime,
    register,
    spark_session,
)
from flightfeed.spark.source import FlightfeedDataSource, FlightfeedPushdownSource

Worker = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_java_home_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    java = executable(tmp_path / "jdk" / "bin" / "java")
    executable(tmp_path / "path" / "java")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    monkeypatch.setenv("PATH", str(tmp_path / "path"))
    assert java_runtime() == str(java)


def test_a_java_home_without_java_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(FlightfeedError, match=f"JAVA_HOME={tmp_path} has no bin/java"):
        java_runtime()


def test_java_on_the_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    java = executable(tmp_path / "java")
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert java_runtime() == str(java)


def test_no_java_says_how_to_get_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FlightfeedError, match="JDK 17 or newer"):
        java_runtime()


def test_a_master_and_a_remote_are_exclusive() -> None:
    with pytest.raises(InvalidArgument, match="not both"):
        spark_session("app", master="local[1]", remote="sc://localhost:15002")


def test_ctrl_c_is_pyspark_or_plain() -> None:
    with pytest.raises(InvalidArgument, match="ctrl_c must be 'pyspark' or 'plain', not 'Plain'"):
        spark_session("app", master="local[1]", ctrl_c="Plain")  # type: ignore[arg-type]


class Conf:
    """Spark's runtime config; `frozen` as in a Declarative Pipeline, which forbids changes."""

    def __init__(self, settings: dict[str, str], *, frozen: bool = False) -> None:
        self.settings = settings
        self.frozen = frozen

    def get(self, key: str, default: str) -> str:
        return self.settings.get(key, default)

    def set(self, key: str, value: str) -> None:
        if self.frozen:
            raise AssertionError(f"the session's config may not change ({key})")
        self.settings[key] = value


class Session:
    """A session whose Python workers run `worker` over one input batch, in this process."""

    def __init__(self, conf: Conf, worker_fails: Exception | None = None) -> None:
        self.conf = conf
        self.registered: list[type] = []
        self.dataSource = SimpleNamespace(register=self.registered.append)
        self.worker_fails = worker_fails
        self.ran: list[tuple[str, int]] = []

    def range(self, end: int, *, numPartitions: int) -> Session:
        self.ran.append(("range", end))
        return self

    def mapInArrow(self, worker: Worker, schema: str) -> Any:
        if self.worker_fails is not None:
            raise self.worker_fails
        assert schema == "version string"
        batches = [pa.record_batch({"id": [0]})]
        rows = [
            SimpleNamespace(version=v)
            for batch in worker(iter(batches))
            for v in batch.column("version").to_pylist()
        ]
        return SimpleNamespace(collect=lambda: rows)


def test_register_with_pushdown_adds_the_pushing_source_and_turns_pushdown_on() -> None:
    spark = Session(Conf({}))
    register(spark, filter_pushdown=True)
    assert spark.registered == [FlightfeedPushdownSource]
    assert spark.conf.settings == {FILTER_PUSHDOWN: "true"}
    assert spark.ran == [("range", 1)]  # the workers were checked


@pytest.mark.parametrize("setting", ["true", "TRUE", "True", "false", None])
def test_register_without_pushdown_adds_the_plain_source_and_leaves_the_setting(
    setting: str | None,
) -> None:
    """The session's other Python data sources may push filters: pyspark refuses their
    readers while the setting is off."""
    spark = Session(Conf({} if setting is None else {FILTER_PUSHDOWN: setting}, frozen=True))
    register(spark, check_workers=False, filter_pushdown=False)
    assert spark.registered == [FlightfeedDataSource]
    assert spark.ran == []


@pytest.mark.parametrize(
    ("keeps_apart", "source", "settings"),
    [
        (True, FlightfeedPushdownSource, {FILTER_PUSHDOWN: "true"}),
        (False, FlightfeedDataSource, {}),
    ],
)
def test_register_pushes_filters_where_spark_keeps_a_pushed_read_to_its_query(
    monkeypatch: pytest.MonkeyPatch, keeps_apart: bool, source: type, settings: dict[str, str]
) -> None:
    """The probe itself runs on a real Spark (tests/spark/test_batch_read.py)."""
    probed: list[Any] = []

    def probe(spark: Any) -> bool:
        probed.append(spark)
        return keeps_apart

    monkeypatch.setattr(session_module, "filters_stay_with_their_query", probe)
    spark = Session(Conf({}))
    register(spark, check_workers=False)
    assert probed == [spark]
    assert spark.registered == [source]
    assert spark.conf.settings == settings


@pytest.mark.parametrize("setting", ["true", "TRUE", "True"])
def test_register_with_pushdown_writes_nothing_when_it_is_on(setting: str) -> None:
    spark = Session(Conf({FILTER_PUSHDOWN: setting}, frozen=True))
    register(spark, check_workers=False, filter_pushdown=True)
    assert spark.registered == [FlightfeedPushdownSource]


def test_workers_running_this_version_pass() -> None:
    check_python_workers(Session(Conf({})))


@pytest.mark.parametrize(
    "failure",
    [
        ModuleNotFoundError("No module named 'flightfeed'"),
        RuntimeError("PythonException: ... ModuleNotFoundError: ... "),
    ],
)
def test_workers_without_flightfeed_say_what_to_install(
    failure: Exception, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/py/bin/python")
    with pytest.raises(
        FlightfeedError, match=r"PYSPARK_PYTHON=/opt/py/bin/python\).*flightfeed\[spark\]"
    ):
        check_python_workers(Session(Conf({}), worker_fails=failure))


def test_other_worker_failures_pass_through() -> None:
    failure = RuntimeError("executor lost")
    with pytest.raises(RuntimeError) as raised:
        check_python_workers(Session(Conf({}), worker_fails=failure))
    assert raised.value is failure


def test_workers_running_another_version_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    spark = Session(Conf({}))
    other = SimpleNamespace(collect=lambda: [SimpleNamespace(version="0.0.1")])
    monkeypatch.setattr(spark, "mapInArrow", lambda worker, schema: other)
    with pytest.raises(
        FlightfeedError, match=rf"run flightfeed \['0.0.1'\], this driver runs {__version__}"
    ):
        check_python_workers(spark)


def test_pyspark_python_default_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    failure = ModuleNotFoundError("No module named 'flightfeed'")
    with pytest.raises(FlightfeedError, match="PYSPARK_PYTHON=the default python3"):
        check_python_workers(Session(Conf({}), worker_fails=failure))
    assert "PYSPARK_PYTHON" not in os.environ
