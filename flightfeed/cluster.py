"""A coordinator's Flight service over workers: what `flightfeed coordinator` runs, and what an
application embeds.

    async with serve(catalog, local_workers=2) as cluster:
        print(cluster.location)   # grpc://127.0.0.1:PORT: any Flight client queries the catalog

`serve_in_background` runs the same on its own event loop in a thread, for synchronous code
such as a PySpark driver: Spark's executors then read the tables from the workers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from anyio.from_thread import BlockingPortal, start_blocking_portal

from .coordinator import Coordinator, StaticWorkerResolver
from .coordinator.catalog import Catalog
from .coordinator.held import DEFAULT_GRACE, DEFAULT_TTL
from .coordinator.service import CoordinatorService
from .errors import InvalidArgument
from .flight.auth import Authenticator, bearer
from .flight.server import FlightServer
from .flight.tls import ClientTls, ServerTls
from .flight.tuning import apply_process_tuning, use_uvloop_default
from .protocol import TYPED_ERRORS
from .protocol.resolver import ChannelResolver
from .worker import Worker, WorkerConfig


@dataclass(eq=False)
class CoordinatorCluster:
    """A running coordinator service: its location, and the parts behind it."""

    location: str
    coordinator: Coordinator
    service: CoordinatorService
    workers: list[Worker] = field(default_factory=list)
    """The local workers it started (not the remote ones it was given)."""
    portal: BlockingPortal | None = None
    """With serve_in_background: runs calls on the cluster's event loop."""


@asynccontextmanager
async def serve(
    catalog: Catalog,
    *,
    workers: Sequence[str] = (),
    local_workers: int = 0,
    host: str = "127.0.0.1",
    port: int = 0,
    advertised_host: str | None = None,
    worker_config: WorkerConfig | None = None,
    ttl: float = DEFAULT_TTL,
    grace: float = DEFAULT_GRACE,
    session_builder: Any = None,
    tls: ServerTls | None = None,
    worker_tls: ClientTls | None = None,
    auth: Authenticator | None = None,
    worker_token: str | None = None,
    **coordinator_options: Any,
) -> AsyncIterator[CoordinatorCluster]:
    """Serve `catalog` on `host:port` over the `workers` given and `local_workers` started
    here (real gRPC servers on free ports whose sessions decode the catalog's nodes, or come
    from `session_builder`; readers are sent to them at `advertised_host`, when given). `tls`:
    serve over TLS (`grpc+tls://`); `worker_tls`: how to reach `grpc+tls://` workers (their
    root CA, the certificate the coordinator presents). `auth`: who may call the service
    (flight/auth.py); `worker_token`: the bearer token sent to the workers.

    Local workers are secured as the coordinator is: they serve with `tls`, check `auth`, and
    reach each other with `worker_tls` and `worker_token`, unless `worker_config` says
    otherwise. Readers are sent to them: a plain worker beside a coordinator with TLS and
    tokens would serve its tables to anyone, in cleartext."""
    if local_workers < 0:
        raise InvalidArgument(f"local_workers must be 0 or more, got {local_workers}")
    if local_workers and auth is not None and worker_token is None:
        raise InvalidArgument(
            "local workers check the coordinator's credentials: give worker_token, the token"
            " the coordinator sends them"
        )
    worker_config = _secured(worker_config or WorkerConfig(), tls, worker_tls, auth, worker_token)
    async with AsyncExitStack() as stack:
        local = [
            await stack.enter_async_context(
                Worker(
                    host=host,
                    advertised_host=advertised_host,
                    session_builder=session_builder or catalog.worker_session,
                    config=worker_config,
                )
            )
            for _ in range(local_workers)
        ]
        urls = [*workers, *(worker.location for worker in local)]
        if not urls:
            raise InvalidArgument("a coordinator needs workers: give worker URLs or local workers")
        options = catalog.coordinator_options() | coordinator_options
        if (worker_tls is not None or worker_token is not None) and "channels" not in options:
            metadata = bearer(worker_token) if worker_token is not None else None
            options["channels"] = ChannelResolver(tls=worker_tls, metadata=metadata)
        coordinator = await stack.enter_async_context(
            Coordinator(StaticWorkerResolver(urls), **options)
        )
        service = CoordinatorService(coordinator, catalog, ttl=ttl, grace=grace)
        server = await stack.enter_async_context(
            FlightServer(service, host=host, port=port, errors=TYPED_ERRORS, tls=tls, auth=auth)
        )
        yield CoordinatorCluster(server.location, coordinator, service, local)


def _secured(
    config: WorkerConfig,
    tls: ServerTls | None,
    peer_tls: ClientTls | None,
    auth: Authenticator | None,
    peer_token: str | None,
) -> WorkerConfig:
    """`config` with the coordinator's security wherever it sets none of its own."""
    return replace(
        config,
        tls=config.tls or tls,
        peer_tls=config.peer_tls or peer_tls,
        auth=config.auth or auth,
        peer_token=config.peer_token or peer_token,
    )


@contextmanager
def serve_in_background(catalog: Catalog, **options: Any) -> Iterator[CoordinatorCluster]:
    """`serve(catalog, **options)` on an event loop of its own, in a thread."""
    apply_process_tuning()
    backend_options = {"use_uvloop": use_uvloop_default()}
    with (
        start_blocking_portal("asyncio", backend_options) as portal,
        portal.wrap_async_context_manager(serve(catalog, **options)) as cluster,
    ):
        cluster.portal = portal
        yield cluster
