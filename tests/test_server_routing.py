"""The API's router finds a request's route in one match per method (keyload/server/routing.py): the
route it picks must be the one Starlette's own scan of the routes would, for every request, over the
API's real paths (those of its OpenAPI document, with the app's `:path` parameters) in either order.
Served behaviour (404, 405, no redirect of a trailing slash) is tests/test_server_http.py's."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match, Route

from keyload.server import openapi
from keyload.server.app import SLASHED_FIELDS
from keyload.server.routing import IndexedRouter

METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS")
SEGMENT_TEXT = st.text(alphabet="ab-_.~%/:é0", min_size=0, max_size=12)


async def _endpoint(_: Request) -> Response:
    return Response()


def _api_routes() -> list[Route]:
    """A route per (path, method) of the OpenAPI document, parameters that may hold '/' as the app
    declares them, plus the health routes the document leaves out."""
    routes = [Route("/healthz", _endpoint, methods=["GET"]), Route("/readyz", _endpoint, methods=["GET"])]
    for path, operations in openapi.document()["paths"].items():
        for name in SLASHED_FIELDS:
            path = path.replace(f"{{{name}}}", f"{{{name}:path}}")
        routes += [Route(path, _endpoint, methods=[method.upper()]) for method in operations]
    return routes


ROUTES = _api_routes()
ROUTERS = (IndexedRouter(ROUTES), IndexedRouter(ROUTES[::-1]))


def _scope(method: str, path: str) -> dict[str, Any]:
    return {"type": "http", "method": method, "path": path, "root_path": "", "path_params": {}}


def _scanned(routes: Sequence[BaseRoute], scope: dict[str, Any]) -> BaseRoute | None:
    """What Starlette's Router.app hands a request to when it matches in full: the first such route."""
    return next((route for route in routes if route.matches(scope)[0] is Match.FULL), None)


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, str]:
    """A method and a path: a route's path with its parameters filled in (any text, '/' included),
    often bent (a segment changed, a slash added or dropped), sometimes any text at all."""
    method = draw(st.sampled_from(METHODS))
    if draw(st.integers(0, 9)) == 0:
        return method, "/" + draw(SEGMENT_TEXT)
    template = draw(st.sampled_from(ROUTES)).path
    path = re.sub(r"\{[^}]+\}", lambda _: draw(SEGMENT_TEXT), template)
    bend = draw(st.integers(0, 4))
    if bend == 1:
        path += "/"
    elif bend == 2:
        path = path.rstrip("/")[:-1]
    elif bend == 3:
        segments = path.split("/")
        segments[draw(st.integers(0, len(segments) - 1))] = draw(SEGMENT_TEXT)
        path = "/".join(segments)
    return method, path


@settings(max_examples=3000, deadline=None)
@given(requests())
def test_the_router_picks_the_route_starlettes_scan_would(request: tuple[str, str]) -> None:
    method, path = request
    for router in ROUTERS:
        scope = _scope(method, path)
        assert router.route_for(scope) is _scanned(router.routes, scope)


def test_every_route_is_found_by_its_own_method_and_path() -> None:
    router = ROUTERS[0]
    for route in ROUTES:
        path = re.sub(r"\{[^}]+\}", "x", route.path)
        for method in route.methods or ():
            scope = _scope(method, path)
            found = router.route_for(scope)
            assert found is not None and found.path == route.path, (method, path)
            assert found is _scanned(ROUTES, scope)


def test_a_path_no_route_of_the_method_takes_is_left_to_starlette() -> None:
    router = ROUTERS[0]
    assert router.route_for(_scope("PATCH", "/healthz")) is None  # a 405, Starlette's to answer
    assert router.route_for(_scope("GET", "/healthz/")) is None  # a 404: no redirect here
    assert router.route_for(_scope("GET", "/nowhere")) is None
