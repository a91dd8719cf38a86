"""A request's route found in one regular-expression match, and its endpoint called directly.

Starlette's router tries each route in turn, in Python, until one matches in path and method: with
the command table's 66 routes ahead of the payload and credential routes, an Enqueue tries 16 and an
ack 19 (about 14 µs a request on the development VM, against under 3 µs here). `IndexedRouter` asks
one alternation per method instead, compiled from the routes' own path patterns in their order, so
the route it finds is the one Starlette's scan would: the first route of that method whose path
matches. `IndexedApp` then hands the request straight to that route's endpoint. A request no route
of its method takes (a 404, a 405) goes through Starlette's middleware and scan, unchanged."""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Mapping, Sequence
from typing import Any

from starlette._utils import get_route_path, is_async_callable  # get_route_path: what Route.matches matches
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import BaseRoute, Match, Route, Router
from starlette.types import ExceptionHandler, Receive, Scope, Send

# A named group of a route's path pattern (Starlette's compile_path writes one per path parameter,
# `(?P<name>regex)`, and escapes everything else): non-capturing in the alternation, where one
# parameter name appears in many routes and a name may be defined only once.
_PARAMETER_GROUP = re.compile(r"\(\?P<[^>]+>")


class IndexedRouter(Router):
    """A Router whose HTTP requests find their route by method and one match of an alternation."""

    def __init__(self, routes: Sequence[BaseRoute], **options: Any) -> None:
        super().__init__(list(routes), **options)
        self._by_method = _index(self.routes)

    def route_for(self, scope: Scope) -> Route | None:
        """The first route, in the router's order, that takes the request's method and path (the
        one Starlette's scan would hand it to); None when no route takes both."""
        entry = self._by_method.get(scope["method"])
        if entry is None:
            return None
        alternation, routes = entry
        found = alternation.match(get_route_path(scope))
        return None if found is None or found.lastgroup is None else routes[int(found.lastgroup[1:])]


class IndexedApp(Starlette):
    """A Starlette application whose router is an `IndexedRouter` and whose HTTP requests that find a
    route go straight to its endpoint: not through Starlette's two exception middlewares, its router
    and the route's request/response wrapper, five awaited layers and two wrapped `send`s per request
    (about 5 % of the server's CPU per Enqueue under 16 concurrent clients; bench/README.md). The
    API needs nothing of them there: its endpoints are async functions, raise no HTTPException and
    write their own refusals. An endpoint that fails unexpectedly still gets ServerErrorMiddleware's
    answer, a plain 500, and its exception goes on to uvicorn, which logs it. A request that finds no
    route (404, 405), the lifespan and any other scope go through Starlette.

    What those layers would add for a found route is refused rather than skipped: middleware (of the
    app or of a route), a body limit, debug pages, exception handlers other than 404's and 405's, and
    endpoints Starlette would treat as ASGI applications."""

    def __init__(self, router: IndexedRouter, exception_handlers: Mapping[Any, ExceptionHandler]) -> None:
        super().__init__(exception_handlers={})
        for route in router.routes:
            assert isinstance(route, Route) and _called_directly(route), f"{route!r} cannot be called directly"
        self.router = router
        for key, handler in exception_handlers.items():
            self.add_exception_handler(key, handler)

    def add_exception_handler(self, exc_class_or_status_code: int | type[Exception], handler: Any) -> None:
        if exc_class_or_status_code not in UNROUTED:
            raise TypeError(f"IndexedApp calls endpoints directly: only {UNROUTED} handlers would run")
        super().add_exception_handler(exc_class_or_status_code, handler)

    def add_middleware(self, middleware_class: Any, *args: Any, **kwargs: Any) -> None:
        raise TypeError("IndexedApp calls endpoints directly: middleware would not run for them")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        router = self.router
        assert isinstance(router, IndexedRouter)
        route = router.route_for(scope) if scope["type"] == "http" else None
        if route is None:
            await super().__call__(scope, receive, send)
            return
        match, child_scope = route.matches(scope)  # the path parameters, converted as Starlette does
        assert match is Match.FULL, f"{route.path} was chosen for {scope['method']} {scope['path']}"
        scope["app"] = self
        scope.setdefault("router", router)
        scope["route"] = route
        scope.update(child_scope)
        try:
            response = await route.endpoint(Request(scope, receive, send))
        except Exception:
            await PlainTextResponse("Internal Server Error", status_code=500)(scope, receive, send)
            raise
        await response(scope, receive, send)


UNROUTED = (404, 405)  # the statuses of requests no route takes: Starlette answers those, with their handlers


def _called_directly(route: Route) -> bool:
    """Whether `route` is what IndexedApp may call without Starlette: an async function or method
    endpoint (Starlette takes any other for an ASGI application), behind nothing but Starlette's own
    request/response wrapper (a function; a route's middleware or body limit would be an object)."""
    endpoint = route.endpoint
    while isinstance(endpoint, functools.partial):
        endpoint = endpoint.func
    is_function = inspect.isfunction(endpoint) or inspect.ismethod(endpoint)
    return is_function and is_async_callable(route.endpoint) and inspect.isfunction(route.app)


def _index(routes: Sequence[BaseRoute]) -> dict[str, tuple[re.Pattern[str], list[Route]]]:
    """For each method, the alternation of the paths of the routes that take it, in their order
    (alternative `_i` is the i-th of those routes)."""
    by_method: dict[str, list[Route]] = {}
    for route in routes:
        assert isinstance(route, Route) and route.methods, "every route of the API is a Route with its methods"
        for method in route.methods:
            by_method.setdefault(method, []).append(route)
    return {method: (_alternation(taking), taking) for method, taking in by_method.items()}


def _alternation(routes: Sequence[Route]) -> re.Pattern[str]:
    """One pattern of the routes' paths, tried in order; the alternative of route i is named `_i`."""
    paths = (_PARAMETER_GROUP.sub("(?:", route.path_regex.pattern) for route in routes)
    return re.compile("|".join(f"(?P<_{i}>{path})" for i, path in enumerate(paths)))
