"""`IndexedApp` (keyload/server/routing.py) calls a found route's endpoint directly, past Starlette's
middleware: the endpoint must see the request as Starlette would hand it over (HEAD and background
tasks included), an endpoint that fails must still be answered 500 with its exception logged, what
no route takes must still get Starlette's answers, and what the direct path would skip (middleware,
other exception handlers, ASGI endpoints) is refused. On a real uvicorn server, driven by httpx."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn
from starlette.background import BackgroundTask
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from keyload.server.routing import IndexedApp, IndexedRouter

STARTUP_S = 10.0
CLEANED = threading.Event()  # set by the background task of GET /cleanup


async def _echo(request: Request) -> Response:
    route = request.scope["route"]
    assert isinstance(route, Route)
    body = await request.body()
    return JSONResponse(
        {
            "path_params": request.path_params,
            "query": dict(request.query_params),
            "route": route.path,
            "state": request.app.state.marker,
            "body": body.decode(),
        },
        status_code=201,
    )


async def _fail(_: Request) -> Response:
    raise RuntimeError("an endpoint bug")


async def _missing(request: Request, _: Exception) -> Response:
    return JSONResponse({"error": "no route", "path": request.url.path}, status_code=404)


def _app() -> IndexedApp:
    async def cleanup(_: Request) -> Response:
        return PlainTextResponse("cleaning", background=BackgroundTask(CLEANED.set))

    router = IndexedRouter(
        [
            Route("/items/{item}/notes/{rest:path}", _echo, methods=["POST"]),
            Route("/items/{item}", _echo, methods=["GET"]),
            Route("/fail", _fail, methods=["GET"]),
            Route("/cleanup", cleanup, methods=["GET"]),
        ],
        redirect_slashes=False,
    )
    app = IndexedApp(router, exception_handlers={404: _missing})
    app.state.marker = "set on the app"
    return app


@pytest.fixture
def base_url() -> Iterator[str]:
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    port = listening.getsockname()[1]
    config = uvicorn.Config(_app(), log_level="warning", lifespan="on", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listening]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + STARTUP_S
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(STARTUP_S)
        listening.close()


def test_a_found_route_sees_its_path_parameters_query_body_route_and_app(base_url: str) -> None:
    with httpx.Client(base_url=base_url) as client:
        posted = client.post("/items/7/notes/a/b%20c?x=1", content=b"hello")
        got = client.get("/items/seven")
    assert posted.status_code == 201
    assert posted.json() == {
        "path_params": {"item": "7", "rest": "a/b c"},
        "query": {"x": "1"},
        "route": "/items/{item}/notes/{rest:path}",
        "state": "set on the app",
        "body": "hello",
    }
    assert got.json()["path_params"] == {"item": "seven"}
    assert got.json()["route"] == "/items/{item}"


def test_a_failing_endpoint_is_answered_500_and_its_exception_logged(
    base_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="uvicorn.error"):
        failed = httpx.get(f"{base_url}/fail")  # uvicorn then closes the connection, as after Starlette's 500
        after = httpx.get(f"{base_url}/items/1")  # the server goes on
    assert (failed.status_code, failed.text) == (500, "Internal Server Error")
    assert after.status_code == 201
    assert any(record.exc_info and "an endpoint bug" in str(record.exc_info[1]) for record in caplog.records)


def test_what_no_route_takes_gets_starlettes_answers(base_url: str) -> None:
    with httpx.Client(base_url=base_url) as client:
        missing = client.get("/nowhere")
        slash = client.get("/items/1/")
        wrong = client.put("/items/1")
    assert (missing.status_code, missing.json()) == (404, {"error": "no route", "path": "/nowhere"})
    assert slash.status_code == 404  # no redirect
    assert wrong.status_code == 405


def test_head_and_background_tasks_work_on_the_direct_path(base_url: str) -> None:
    CLEANED.clear()
    with httpx.Client(base_url=base_url) as client:
        head = client.head("/items/3")
        cleaned = client.get("/cleanup")
    assert (head.status_code, head.content) == (201, b"")
    assert int(head.headers["content-length"]) > 0
    assert cleaned.text == "cleaning"
    assert CLEANED.wait(STARTUP_S), "the response's background task ran after it was sent"


async def _plain(_: Request) -> Response:
    return Response()


class _AsgiEndpoint:
    async def __call__(self, scope: object, receive: object, send: object) -> None:
        raise AssertionError("never called")


def test_what_the_direct_path_would_skip_is_refused() -> None:
    def blocking(_: Request) -> Response:
        return Response()

    def app_of(route: Route) -> IndexedApp:
        return IndexedApp(IndexedRouter([route]), exception_handlers={})

    with pytest.raises(AssertionError, match="cannot be called directly"):
        app_of(Route("/b", blocking, methods=["GET"]))
    with pytest.raises(AssertionError, match="cannot be called directly"):
        app_of(Route("/a", _AsgiEndpoint(), methods=["GET"]))
    with pytest.raises(AssertionError, match="cannot be called directly"):
        app_of(Route("/m", _plain, methods=["GET"], middleware=[Middleware(GZipMiddleware)]))
    with pytest.raises(AssertionError, match="cannot be called directly"):
        app_of(Route("/l", _plain, methods=["GET"], max_body_size=10))
    app = app_of(Route("/ok", _plain, methods=["GET"]))
    with pytest.raises(TypeError, match="middleware would not run"):
        app.add_middleware(GZipMiddleware)
    with pytest.raises(TypeError, match="handlers would run"):
        app.add_exception_handler(500, _missing)
    with pytest.raises(TypeError, match="handlers would run"):
        IndexedApp(IndexedRouter([]), exception_handlers={RuntimeError: _missing})
