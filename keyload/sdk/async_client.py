"""`AsyncClient`: the typed API of `Client` for asyncio programs, over a keyload server.

Every method is the `Client` method of the same name, run on a worker thread of the client's own
pool, so the event loop is never blocked while a command waits for its outcome (a long poll
included) and up to `max_concurrency` calls are in flight at once over one kept-alive HTTP
connection pool (httpx.Client is thread-safe; a client of a server keeps no other state between
calls). Results, exceptions and arguments are exactly `Client`'s.

    async with AsyncClient("http://127.0.0.1:7411", credential=Credential.load(path)) as client:
        await client.enqueue("shop", "orders", b"...")
        batch = await client.receive("shop", "orders", wait_ms=20_000)

`consume` and `subscribe` run the consumer helper on a worker thread until its `stop` is set. Their
handler may be a coroutine function: each call it makes runs on the caller's event loop, while a
thread of the helper's pool waits for it (so `concurrency` of them run at once).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar, Unpack

from keyload.credentials import Credential
from keyload.errors import InvalidCommand
from keyload.sdk.client import DEFAULT_TIMEOUT_S, Client, is_server_url
from keyload.sdk.consumer import DEFAULT_WAIT_MS, ConsumeStats, Handled, WorkOptions
from keyload.sdk.results import Delivery, GroupDelivery

if TYPE_CHECKING:
    from keyload.sdk.http_transport import Verify

P = ParamSpec("P")
T = TypeVar("T")
D = TypeVar("D")
DEFAULT_MAX_CONCURRENCY = 64  # calls in flight at once (worker threads)


async def _on_pool(client: AsyncClient, call: Callable[[], T]) -> T:
    """`call` (of `client.client`), awaited on the async client's pool."""
    if not client._closed:
        try:
            return await asyncio.get_running_loop().run_in_executor(client._pool, call)
        except RuntimeError:
            if not client._closed:
                raise
            # closed while this call was handed to the pool ("cannot schedule new futures")
    raise InvalidCommand("the client is closed; nothing was sent")  # as a closed Client says


def _on_thread(method: Callable[Concatenate[Client, P], T]) -> Callable[Concatenate[AsyncClient, P], Awaitable[T]]:
    """`Client.method`, awaited on the async client's pool."""

    async def run(self: AsyncClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await _on_pool(self, functools.partial(method, self.client, *args, **kwargs))

    run.__name__, run.__qualname__, run.__doc__ = method.__name__, f"AsyncClient.{method.__name__}", method.__doc__
    return run


def _on_loop(handler: Callable[[D], Handled | Awaitable[Handled]]) -> Callable[[D], Handled]:
    """`handler` for the consumer helper's thread pool: an awaitable it returns is awaited on the
    calling event loop, and the pool's thread waits for the result (or the exception)."""
    loop = asyncio.get_running_loop()

    async def awaited(returned: Awaitable[Handled]) -> Handled:
        return await returned

    def run(delivery: D) -> Handled:
        returned = handler(delivery)
        if inspect.isawaitable(returned):
            return asyncio.run_coroutine_threadsafe(awaited(returned), loop).result()
        return returned

    return run


class AsyncClient:
    def __init__(
        self,
        url: str,
        *,
        credential: Credential,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        verify: Verify = True,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
    ) -> None:
        if not is_server_url(url):
            raise InvalidCommand("AsyncClient speaks to a keyload server: give its http:// or https:// URL")
        self.client = Client(url, credential=credential, timeout_s=timeout_s, verify=verify)
        self._pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="keyload-async")
        self._closed = False

    async def close(self) -> None:
        """Close the connections and the pool; a later call is InvalidCommand. Closing twice is harmless."""
        if self._closed:
            return
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(self._pool, self.client.close)
        self._pool.shutdown(wait=False)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: Any) -> None:
        await self.close()

    @property
    def principal(self) -> str:
        return self.client.principal

    # The typed API, method for method (keyload/sdk/client.py).
    submit = _on_thread(Client.submit)
    send = _on_thread(Client.send)
    create_queue = _on_thread(Client.create_queue)
    configure_queue = _on_thread(Client.configure_queue)
    enqueue = _on_thread(Client.enqueue)
    inspect_queue = _on_thread(Client.inspect_queue)
    list_queues = _on_thread(Client.list_queues)
    pause_queue = _on_thread(Client.pause_queue)
    resume_queue = _on_thread(Client.resume_queue)
    close_queue = _on_thread(Client.close_queue)
    delete_queue = _on_thread(Client.delete_queue)
    purge_queue = _on_thread(Client.purge_queue)
    inspect_message = _on_thread(Client.inspect_message)
    receive = _on_thread(Client.receive)
    receive_across = _on_thread(Client.receive_across)
    renew = _on_thread(Client.renew)
    ack = _on_thread(Client.ack)
    ack_batch = _on_thread(Client.ack_batch)
    nack = _on_thread(Client.nack)

    async def consume(
        self,
        domain: str,
        queue: str,
        handler: Callable[[Delivery], Handled | Awaitable[Handled]],
        *,
        wait_ms: int = DEFAULT_WAIT_MS,
        **options: Unpack[WorkOptions],
    ) -> ConsumeStats:
        """`Client.consume`, whose handler may be a coroutine function (module docstring)."""
        work = functools.partial(self.client.consume, domain, queue, _on_loop(handler), wait_ms=wait_ms, **options)
        return await _on_pool(self, work)

    async def subscribe(
        self,
        domain: str,
        topic: str,
        group: str,
        handler: Callable[[GroupDelivery], Handled | Awaitable[Handled]],
        *,
        wait_ms: int = DEFAULT_WAIT_MS,
        **options: Unpack[WorkOptions],
    ) -> ConsumeStats:
        """`Client.subscribe`, whose handler may be a coroutine function (module docstring)."""
        handle = _on_loop(handler)
        work = functools.partial(self.client.subscribe, domain, topic, group, handle, wait_ms=wait_ms, **options)
        return await _on_pool(self, work)

    list_dead_letters = _on_thread(Client.list_dead_letters)
    redrive = _on_thread(Client.redrive)
    cancel = _on_thread(Client.cancel)
    park_pending = _on_thread(Client.park_pending)
    create_topic = _on_thread(Client.create_topic)
    configure_topic = _on_thread(Client.configure_topic)
    close_topic = _on_thread(Client.close_topic)
    delete_topic = _on_thread(Client.delete_topic)
    delete_group = _on_thread(Client.delete_group)
    publish = _on_thread(Client.publish)
    read_topic = _on_thread(Client.read_topic)
    inspect_topic = _on_thread(Client.inspect_topic)
    list_topics = _on_thread(Client.list_topics)
    purge_topic = _on_thread(Client.purge_topic)
    create_group = _on_thread(Client.create_group)
    group_receive = _on_thread(Client.group_receive)
    group_ack = _on_thread(Client.group_ack)
    group_ack_batch = _on_thread(Client.group_ack_batch)
    group_nack = _on_thread(Client.group_nack)
    group_renew = _on_thread(Client.group_renew)
    group_status = _on_thread(Client.group_status)
    seek_group = _on_thread(Client.seek_group)
    configure_group = _on_thread(Client.configure_group)
    pause_group = _on_thread(Client.pause_group)
    resume_group = _on_thread(Client.resume_group)
    put_document = _on_thread(Client.put_document)
    delete_document = _on_thread(Client.delete_document)
    get_document = _on_thread(Client.get_document)
    list_documents = _on_thread(Client.list_documents)
    batch = _on_thread(Client.batch)
    complete_processing = _on_thread(Client.complete_processing)
    configure_inbox = _on_thread(Client.configure_inbox)
    commit_inbox = _on_thread(Client.commit_inbox)
    configure_domain = _on_thread(Client.configure_domain)
    configure_domain_caps = _on_thread(Client.configure_domain_caps)
    inspect_domain = _on_thread(Client.inspect_domain)
    prepare_large_schedule = _on_thread(Client.prepare_large_schedule)
    commit_large_schedule = _on_thread(Client.commit_large_schedule)
    cancel_large_schedule = _on_thread(Client.cancel_large_schedule)
    inspect_reservation = _on_thread(Client.inspect_reservation)
    schedule_large = _on_thread(Client.schedule_large)
    read_payload = _on_thread(Client.read_payload)
    rotate_keys = _on_thread(Client.rotate_keys)
    put_principal = _on_thread(Client.put_principal)
    grant = _on_thread(Client.grant)
    revoke = _on_thread(Client.revoke)
    inspect_principal = _on_thread(Client.inspect_principal)
    whoami = _on_thread(Client.whoami)
    create_principal = _on_thread(Client.create_principal)
    rotate_credential = _on_thread(Client.rotate_credential)
    list_retention = _on_thread(Client.list_retention)
    advance_recovery_floor = _on_thread(Client.advance_recovery_floor)
    begin_delete = _on_thread(Client.begin_delete)
    delete_confirmed = _on_thread(Client.delete_confirmed)
    request_checkpoint = _on_thread(Client.request_checkpoint)
    census = _on_thread(Client.census)  # the server's, over HTTP (`GET /v1/census`)
    partition_domain = _on_thread(Client.partition_domain)  # asks the server's partition count once
