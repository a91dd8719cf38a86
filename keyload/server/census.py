"""`GET /v1/census`: the census of the projections this server's data directory holds
(keyload/operations/census.py), so an operator with only a client of the server (`Client.census`)
sees what state is kept, and what the horizons have still to remove, without a shell on the machine.

    GET /v1/census                  {"partitions": [census, ...]}: every partition with a projection here
    GET /v1/census?partition=P      {"partitions": [census]}: partition P (404 without a projection here)

An embedded server holds every partition's projection once it has served it; a Kafka processor's server
only those of the partitions its processor holds or has held. The census names domains (those at a cap),
so it needs inspect on every domain, as metrics do; a Kafka processor's server holds no policy to check
that against, so any credential the keyring accepts reads it there, and it lists no domain (`at_cap`
empty, `at_cap_total` still counting them): `keyload census` on the node lists them. It reads every row
of each projection (about a second per million rows), on a worker thread, so the event loop keeps
answering commands meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import asdict

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from keyload.errors import CensusError
from keyload.operations.census import censuses
from keyload.projections.store import StoreError
from keyload.server import statuses
from keyload.server.app import Engine, error_response, inspector_refusal, partition_number
from keyload.storage.datadir import DataDir
from keyload.wire import CENSUS_PATH, PARTITION_QUERY, WireError

NO_PROJECTION = ("NotFound", 404)
log = logging.getLogger("keyload.server")


def census_route(engine: Engine, data: DataDir) -> Route:
    async def census(request: Request) -> Response:
        refused = inspector_refusal(engine, request, "the census needs inspect on every domain")
        if refused is not None:
            return refused
        unknown = sorted(set(request.query_params) - {PARTITION_QUERY})
        if unknown:
            return error_response(statuses.BAD_REQUEST, f"{unknown[0][:64]} is not a parameter of the census")
        given = request.query_params.getlist(PARTITION_QUERY)
        if len(given) > 1:
            return error_response(statuses.BAD_REQUEST, "partition is given twice")
        try:
            partition = None if not given else partition_number(given[0], data.partitions)
        except WireError as exc:
            return error_response(statuses.BAD_REQUEST, str(exc))
        try:
            counted = await asyncio.to_thread(censuses, data, partition)
        except CensusError as exc:
            return error_response(NO_PROJECTION, str(exc))
        except StoreError:  # a Kafka processor swapping a checkpoint in for the projection (its path stays here)
            return error_response(statuses.UNAVAILABLE, "a projection cannot be read now: retry")
        except Exception:  # a bug, or RocksDB failing mid-scan: the request fails alone, in the API's own form
            log.exception("GET %s failed", CENSUS_PATH)
            return error_response(statuses.INTERNAL, "the server failed to answer this request (see its log)")
        answered = [asdict(found) for found in counted]
        if data.kafka is not None:  # the caller was not checked for inspect on every domain: name none
            for found in answered:
                found["at_cap"] = []
        return JSONResponse({"partitions": answered})

    return Route(CENSUS_PATH, census, methods=["GET"], name="census")
