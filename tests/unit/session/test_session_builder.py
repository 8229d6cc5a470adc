"""Sessions per request: headers, builders (object, async/sync function, by import path), and
UDF resolution that differs between sessions built from different headers."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from flightfeed._generated.flightfeed.v1 import TaskKey
from flightfeed.errors import InvalidArgument, UnknownUdfError
from flightfeed.plan import (
    MemoryScan,
    Projection,
    ScalarUdf,
    call,
    col,
    collect,
    open_task_context,
)
from flightfeed.session import (
    DEFAULT_SESSION_BUILDER,
    Headers,
    Session,
    SessionBuilder,
    SessionStateBuilder,
    WorkerQueryContext,
    as_session_builder,
    load_session_builder,
)

pytestmark = pytest.mark.anyio

UPPER = ScalarUdf("normalize", pc.utf8_upper, pa.string())
LOWER = ScalarUdf("normalize", pc.utf8_lower, pa.string())


async def tenant_builder(ctx: WorkerQueryContext) -> Session:
    """Picks the tenant's UDFs and configuration from the request headers."""
    udf = UPPER if ctx.headers.get("x-tenant") == "loud" else LOWER
    return (
        ctx.builder.with_scalar_udf(udf).with_configs({"tenant": ctx.headers["x-tenant"]}).build()
    )


def test_headers_are_case_insensitive_and_multi_valued() -> None:
    headers = Headers([("X-Tenant", "a"), ("x-role", "r1"), ("X-ROLE", "r2")])
    assert headers["x-tenant"] == "a"
    assert headers["X-Role"] == "r1"
    assert headers.get_all("x-role") == ("r1", "r2")
    assert headers.get_all("missing") == ()
    assert list(headers) == ["x-tenant", "x-role"]
    assert len(headers) == 2
    assert "X-TENANT" in headers
    assert headers.pairs()[2] == ("x-role", "r2")
    assert Headers({"A": "1"})["a"] == "1"


def test_builder_is_immutable_and_builds_sessions() -> None:
    base = SessionStateBuilder().with_config("a", "1")
    derived = base.with_scalar_udf(UPPER).with_memory_budget(1 << 20).with_config("a", "2")
    assert base.build().scalar_udf("normalize") is None
    assert base.build().config == {"a": "1"}
    session = derived.build()
    assert session.scalar_udf("normalize") is UPPER
    assert session.config == {"a": "2"}
    assert session.memory_budget_bytes == 1 << 20
    assert session.aggregate_udf("normalize") is None
    with pytest.raises(InvalidArgument):
        base.with_memory_budget(0)
    with pytest.raises(InvalidArgument):
        base.with_scalar_udf(ScalarUdf("", pc.utf8_upper, pa.string()))


async def test_two_sessions_from_different_headers_resolve_different_udfs() -> None:
    builder = as_session_builder(tenant_builder)
    loud = await builder.build(WorkerQueryContext(Headers({"x-tenant": "loud"})))
    quiet = await builder.build(WorkerQueryContext(Headers({"x-tenant": "quiet"})))
    assert loud.config["tenant"] == "loud"

    table = pa.table({"s": ["MiXeD", "case"]})
    plan = Projection(
        MemoryScan.from_table(table), [call("normalize", col("s"))], ["s"], functions=loud
    )
    data = loud.encode_plan(plan)  # the wire form names the UDF; each session resolves it
    results = {}
    for name, session in (("loud", loud), ("quiet", quiet)):
        decoded = session.decode_plan(data)
        async with open_task_context(session) as ctx:
            results[name] = (await collect(decoded, ctx)).column("s").to_pylist()
    assert results == {"loud": ["MIXED", "CASE"], "quiet": ["mixed", "case"]}

    plain = await DEFAULT_SESSION_BUILDER.build(WorkerQueryContext())
    with pytest.raises(UnknownUdfError, match="normalize"):
        plain.decode_plan(data)


async def test_builder_forms() -> None:
    ctx = WorkerQueryContext(
        Headers(), SessionStateBuilder().with_config("k", "v"), TaskKey(query_id=b"q", stage_id=1)
    )

    class Builder:
        async def build(self, ctx: WorkerQueryContext, /) -> Session:
            return ctx.builder.with_config("from", "object").build()

    def sync_builder(ctx: WorkerQueryContext) -> Session:
        return ctx.builder.build()

    obj = Builder()
    assert isinstance(obj, SessionBuilder)
    assert as_session_builder(obj) is obj
    assert (await as_session_builder(obj).build(ctx)).config == {"k": "v", "from": "object"}
    assert (await as_session_builder(sync_builder).build(ctx)).config == {"k": "v"}
    assert (await DEFAULT_SESSION_BUILDER.build(ctx)).config == {"k": "v"}

    async def wrong(ctx: WorkerQueryContext) -> Session:
        return "not a session"  # type: ignore[return-value]

    with pytest.raises(TypeError, match="expected a flightfeed Session"):
        await as_session_builder(wrong).build(ctx)


@pytest.fixture
def builders_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    package = tmp_path / "ff_test_builders"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "mod.py").write_text(
        textwrap.dedent(
            """
            from flightfeed.session import Session

            async def build(ctx):
                return ctx.builder.with_config("loaded", "function").build()

            class Builder:
                async def build(self, ctx):
                    return ctx.builder.with_config("loaded", "class").build()

            class Holder:
                instance = Builder()

            NOT_A_BUILDER = 42

            def needs_two(ctx, extra):
                return None

            def needs_none():
                return None
            """
        )
    )
    (package / "broken.py").write_text("import does_not_exist_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "ff_test_builders"
    for name in [m for m in sys.modules if m.startswith("ff_test_builders")]:
        del sys.modules[name]


@pytest.mark.parametrize(
    ("attribute", "loaded"),
    [("build", "function"), ("Builder", "class"), ("Holder.instance", "class")],
)
async def test_load_session_builder(builders_module: str, attribute: str, loaded: str) -> None:
    builder = load_session_builder(f"{builders_module}.mod:{attribute}")
    assert (await builder.build(WorkerQueryContext())).config == {"loaded": loaded}


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("no_colon", "must look like"),
        (":build", "must look like"),
        ("pkg.mod:", "must look like"),
        ("surely_missing_module_xyz:build", "module 'surely_missing_module_xyz' not found"),
        ("{m}.broken:build", "importing '{m}.broken' failed"),
        ("{m}.mod:missing", "has no attribute 'missing'"),
        ("{m}.mod:NOT_A_BUILDER", "not a function"),
        ("{m}.mod:needs_two", "cannot be called with one argument"),
        ("{m}.mod:needs_none", "cannot be called with one argument"),
    ],
)
def test_load_session_builder_errors(builders_module: str, path: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message.format(m=builders_module)):
        load_session_builder(path.format(m=builders_module))
