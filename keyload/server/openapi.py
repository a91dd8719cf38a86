"""The OpenAPI document of the HTTP API, derived from the command table and the Avro schemas.

`docs/openapi.json` is this document, checked in for clients in other languages; the server serves
it at `/v1/openapi.json`, and tests/test_server_http.py fails when the file drifts from what this
module derives. Regenerate with `python -m keyload.server.openapi > docs/openapi.json`.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from keyload.commands import COMMANDS, CommandKind
from keyload.server import statuses
from keyload.server.app import METRICS_PATH, OPENAPI_PATH, RAW_BODY_FIELD, RAW_BODY_TYPE
from keyload.server.coalescing import CARRIERS
from keyload.server.payloads import PREPARE, READ_PATH, UPLOAD_PATH
from keyload.server.principals import CREATE_PATH, ROTATE_PATH
from keyload.version import __version__
from keyload.wire import (
    CENSUS_PATH,
    COALESCE_HEADER,
    COMMAND_ID_HEADER,
    ENVELOPE_PATH,
    IDEMPOTENCY_HEADER,
    PARTITION_QUERY,
    SERVICE_PATH,
    UPLOAD_HANDLE_HEADER,
    field_schema,
    json_schema,
    names,
    required,
)

_SCALARS = ("string", "int", "long", "boolean")


def _path_parameter(name: str) -> dict[str, Any]:
    kind = "integer" if name == "partition" else "string"
    return {"name": name, "in": "path", "required": True, "schema": {"type": kind}}


def _scalar(schema: Any) -> bool:
    if isinstance(schema, list):
        rest = [b for b in schema if b != "null"]
        return len(rest) == 1 and _scalar(rest[0])
    return schema in _SCALARS or (isinstance(schema, dict) and schema.get("type") == "enum")


def _operation(kind: CommandKind, refs: dict[str, Any]) -> dict[str, Any]:
    assert kind.route is not None
    commands = names("keyload.Command")
    record = commands.types[kind.branch]
    in_path = set(kind.route.fields)
    parameters = [_path_parameter(name) for name in kind.route.fields]
    parameters.append(_idempotency_parameter())
    carrier = CARRIERS.get(kind.name)
    if carrier is not None:
        parameters.append(_coalesce_parameter(carrier.batch, carrier.joins))
    everywhere = kind.partition_wide and not in_path & {"partition", "domain"}
    if everywhere and kind.route.method == "GET":
        parameters.append(
            {
                "name": PARTITION_QUERY,
                "in": "query",
                "required": False,
                "description": "the partition whose view to read (default 0)",
                "schema": {"type": "integer"},
            }
        )
    body_fields = [f for f in record["fields"] if f["name"] not in in_path]
    operation: dict[str, Any] = {
        "operationId": kind.name,
        "summary": record.get("doc", kind.name),
        "tags": [_family(kind)],
        "parameters": parameters,
        "responses": _responses(kind, refs),
    }
    if kind.route.method in ("GET", "DELETE"):
        for f in body_fields:
            if _scalar(f["type"]):
                described = json_schema(commands, f["type"], refs)
                parameter = {"name": f["name"], "in": "query", "required": "default" not in f, "schema": described}
                parameters.append(parameter | _request_default(kind, f["name"]))
    elif body_fields:
        properties = {
            f["name"]: json_schema(commands, f["type"], refs) | _request_default(kind, f["name"]) for f in body_fields
        }
        schema = {
            "type": "object",
            "properties": properties,
            "required": [
                f["name"] for f in body_fields if required(commands, f) and not _request_default(kind, f["name"])
            ],
            "additionalProperties": False,
        }
        content: dict[str, Any] = {"application/json": {"schema": schema}}
        if any(f["name"] == RAW_BODY_FIELD and f["type"] == "bytes" for f in body_fields):
            content[RAW_BODY_TYPE] = {"schema": {"type": "string", "format": "binary"}}
        operation["requestBody"] = _request_body(content, bool(schema["required"]))
    return operation


def _request_body(content: dict[str, Any], fields_required: bool) -> dict[str, Any]:
    """A command's JSON body: required when it has required members. The server takes any scalar
    member as a query parameter too (§10a), so a request without a body may still be whole, but a
    client built from this document sends the body, which is what the required members ask for."""
    body: dict[str, Any] = {"required": fields_required, "content": content}
    if fields_required:
        body["description"] = (
            "a member that is a string, number or boolean may instead be given as a query parameter "
            "(not both: a field given twice is a 400 Validation)"
        )
    return body


def _request_default(kind: CommandKind, name: str) -> dict[str, Any]:
    """The description of the field the table fills in when a request leaves it out (`RequestDefault`)."""
    default = kind.request_default
    if default is None or default.field != name:
        return {}
    others = " nor ".join(default.unless)
    when = f"neither it nor {others} is given" if others else "it is not given"
    return {"description": f"default {default.value} when {when}"}


def _family(kind: CommandKind) -> str:
    assert kind.route is not None
    segments = kind.route.path.split("/")
    families = ("groups", "topics", "queues", "leases", "documents", "inbox", "reservations", "keys", "batch")
    return next((family for family in families if family in segments), segments[2])


def _responses(kind: CommandKind, refs: dict[str, Any]) -> dict[str, Any]:
    outcomes = names("keyload.Outcome")
    result = json_schema(outcomes, outcomes.types[kind.result], refs)
    outcome = {"allOf": [{"$ref": "#/components/schemas/Outcome"}, {"properties": {"result": result}}]}
    headers = {COMMAND_ID_HEADER: _COMMAND_ID}
    if kind is PREPARE:
        headers[UPLOAD_HANDLE_HEADER] = _UPLOAD_HANDLE
    return {
        "200": {
            "description": "committed: the outcome, its result",
            "headers": headers,
            "content": {"application/json": {"schema": outcome}},
        },
        "default": _refused(),
    }


def _components(refs: dict[str, Any]) -> dict[str, Any]:
    outcomes = names("keyload.Outcome")
    outcome = outcomes.types["keyload.Outcome"]
    properties = {f["name"]: json_schema(outcomes, f["type"], refs) for f in outcome["fields"] if f["name"] != "result"}
    properties["result"] = {"description": "the command's result record (see each operation), null when refused"}
    codes = sorted({code for code, _ in statuses.HTTP_ERRORS} | {str(code) for code in statuses.HTTP_STATUS})
    refusal = {
        "type": "object",
        "properties": {
            "status": {"type": "string", "enum": ["rejected", "error"]},
            "error_code": {"type": "string", "enum": codes},
            "detail": {"type": "string"},
            "command_id": {"type": ["string", "null"]},
        },
        "required": ["status", "error_code", "detail"],
    }
    return {
        "schemas": {"Outcome": {"type": "object", "properties": properties}, "Refusal": refusal, **refs},
        "securitySchemes": {
            "bearer": {
                "type": "http",
                "scheme": "bearer",
                "description": "a principal's credential, PRINCIPAL:KEY_ID:SECRET (secret in unpadded base64url)",
            }
        },
    }


def _envelope_operation(refs: dict[str, Any]) -> dict[str, Any]:
    commands = names("keyload.Command")
    union = field_schema(commands, commands.types["keyload.Command"], "body")
    envelope = {
        "type": "object",
        "properties": {"domain": {"type": "string"}, "body": json_schema(commands, union, refs)},
        "required": ["domain", "body"],
        "additionalProperties": False,
    }
    outcome = {"$ref": "#/components/schemas/Outcome"}
    return {
        "operationId": "command",
        "summary": "any command as the log takes it: its domain and its body, one member named by its kind",
        "tags": ["commands"],
        "parameters": [_idempotency_parameter()],
        "requestBody": {"required": True, "content": {"application/json": {"schema": envelope}}},
        "responses": {
            "200": {
                "description": "committed",
                "headers": {
                    COMMAND_ID_HEADER: _COMMAND_ID,
                    UPLOAD_HANDLE_HEADER: _UPLOAD_HANDLE | {"description": f"{PREPARE.name}: {_HANDLE_TEXT}"},
                },
                "content": {"application/json": {"schema": outcome}},
            },
            "default": _refused(),
        },
    }


_HANDLE_TEXT = "the reservation's upload handle, signed by the service: its upload takes it back"
_UPLOAD_HANDLE = {"schema": {"type": "string"}, "description": _HANDLE_TEXT}
_COMMAND_ID = {"schema": {"type": "string"}, "description": "the command id"}


def _credential_operations(refs: dict[str, Any]) -> dict[str, Any]:
    """POST /v1/principals and /v1/principals/{principal}/credential (keyload/server/principals.py)."""
    commands = names("keyload.Command")
    outcomes = names("keyload.Outcome")
    issued = {
        "type": "object",
        "properties": {
            "principal": json_schema(outcomes, "keyload.result.PrincipalView", refs),
            "credential": {
                "type": "object",
                "properties": {
                    "principal": {"type": "string"},
                    "key_id": {"type": "string"},
                    "secret": {"type": "string", "contentEncoding": "base64"},
                },
            },
            "bearer_token": {"type": "string"},
        },
    }
    responses = {
        "200": {
            "description": "the credential (sent again with its Idempotency-Key: the same one)",
            "headers": {COMMAND_ID_HEADER: _COMMAND_ID},
            "content": {"application/json": {"schema": issued}},
        },
        "default": _refused(),
    }
    create_body = {
        "type": "object",
        "properties": {
            "principal": {"type": "string"},
            "grants": {"type": "array", "items": json_schema(commands, "keyload.Grant", refs)},
        },
        "required": ["principal"],
        "additionalProperties": False,
    }
    return {
        CREATE_PATH: {
            "post": {
                "operationId": "create_principal",
                "summary": "a new principal with a new key (admin on every domain); its credential is answered once",
                "tags": ["principals"],
                "parameters": [_idempotency_parameter()],
                "requestBody": {"required": True, "content": {"application/json": {"schema": create_body}}},
                "responses": responses,
            }
        },
        ROTATE_PATH: {
            "post": {
                "operationId": "rotate_credential",
                "summary": "a new key for an existing principal (admin on every domain); the old one is refused",
                "tags": ["principals"],
                "parameters": [_path_parameter("principal"), _idempotency_parameter()],
                "responses": responses,
            }
        },
    }


def _payload_operations(refs: dict[str, Any]) -> dict[str, Any]:
    """The payload routes the server answers itself (keyload/server/payloads.py)."""
    outcomes = names("keyload.Outcome")
    reservation = json_schema(outcomes, "keyload.PayloadReservation", refs)
    outcome = {"allOf": [{"$ref": "#/components/schemas/Outcome"}, {"properties": {"result": reservation}}]}
    raw = {"schema": {"type": "string", "format": "binary"}}
    handle = {
        "type": "object",
        "properties": {"read_handle": {"type": "string"}},
        "required": ["read_handle"],
        "additionalProperties": False,
    }
    return {
        UPLOAD_PATH: {
            "put": {
                "operationId": "upload_payload",
                "summary": "a reservation's bytes: the service stores, attests and commits them (the commit's outcome)",
                "tags": ["reservations"],
                "parameters": [
                    _path_parameter("domain"),
                    _path_parameter("reservation_id"),
                    {
                        "name": UPLOAD_HANDLE_HEADER,
                        "in": "header",
                        "required": False,
                        "description": "the upload handle the reservation was answered with (a Kafka server needs it)",
                        "schema": {"type": "string"},
                    },
                ],
                "requestBody": {"required": True, "content": {"application/octet-stream": raw}},
                "responses": {
                    "200": {"description": "committed", "content": {"application/json": {"schema": outcome}}},
                    "default": _refused(),
                },
            }
        },
        READ_PATH: {
            "post": {
                "operationId": "read_payload",
                "summary": "a large delivery's bytes, by its read handle, while its lease lasts",
                "tags": ["payloads"],
                "requestBody": {"required": True, "content": {"application/json": {"schema": handle}}},
                "responses": {
                    "200": {"description": "the bytes", "content": {"application/octet-stream": raw}},
                    "default": _refused(),
                },
            }
        },
    }


def _idempotency_parameter() -> dict[str, Any]:
    return _header_parameter(
        IDEMPOTENCY_HEADER,
        "the command id (1..128 printable ASCII): a repeat within the domain's outcome horizon "
        "returns the stored outcome, a receive's with each lease as it stands; past it, 410 HistoryUnavailable "
        "until the receipt horizon, then the id is new (a read keeps none: its repeat is answered afresh)",
        {"type": "string"},
    )


def _coalesce_parameter(batch: str, joins: str) -> dict[str, Any]:
    return _header_parameter(
        COALESCE_HEADER,
        f"true: the request may go in one {batch} command with this caller's other coalesced "
        f"requests of its kind to the {joins} (fewer commands under load); answered as alone, its outcome "
        f"naming the command that carried it (the {batch}, or the request's own when it went alone). "
        "Not with Idempotency-Key (400): the request has no command id of its own",
        {"type": "string", "enum": ["true", "false"]},
    )


def _header_parameter(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "header", "required": False, "description": description, "schema": schema}


READINESS_LISTS = ("catching_up", "halted", "stalled")


def _json_object(properties: dict[str, Any]) -> dict[str, Any]:
    """A JSON body that is an object of exactly these members."""
    schema = {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}
    return {"application/json": {"schema": schema}}


def _refused() -> dict[str, Any]:
    return {
        "description": "refused: a rejected outcome (status rejected) with its error code's HTTP status, "
        "or an error of the HTTP layer (status error: nothing was appended, or no outcome came in time)",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Refusal"}}},
    }


def document() -> dict[str, Any]:
    refs: dict[str, Any] = {}
    paths: dict[str, dict[str, Any]] = {}
    for kind in COMMANDS:
        if kind.route is not None:
            paths.setdefault(kind.route.path, {})[kind.route.method.lower()] = _operation(kind, refs)
    by_partition = {"type": "object", "additionalProperties": {"type": "string"}, "description": "partition → why"}
    readiness_body = _json_object(
        {"status": {"type": "string", "enum": ["ready", "unavailable"]}, **dict.fromkeys(READINESS_LISTS, by_partition)}
    )
    readiness = {
        "200": {
            "description": '{"status": "ready", "catching_up": {}, "halted": {...}, "stalled": {...}}: every partition '
            "has applied the backlog it had at start, or is halted or stalled (listed with why: it stops alone, the "
            "others serve)",
            "content": readiness_body,
        },
        "503": {
            "description": '{"status": "unavailable", "catching_up": {partition: progress}, ...}: a partition is '
            "still applying the backlog it had at start",
            "content": readiness_body,
        },
    }
    paths[ENVELOPE_PATH] = {"post": _envelope_operation(refs)}
    paths.update(_credential_operations(refs))
    paths.update(_payload_operations(refs))
    paths[SERVICE_PATH] = {
        "get": {
            "operationId": "service",
            "security": [],
            "summary": "the server's version and partition count",
            "responses": {
                "200": {
                    "description": '{"version": V, "partitions": N}',
                    "content": _json_object({"version": {"type": "string"}, "partitions": {"type": "integer"}}),
                }
            },
        }
    }
    paths[METRICS_PATH] = {
        "get": {
            "operationId": "metrics",
            "summary": "Prometheus metrics (text exposition format), for a principal with inspect on every domain",
            "responses": {
                "200": {"description": "metrics", "content": {"text/plain": {"schema": {"type": "string"}}}},
                "default": _refused(),
            },
        }
    }
    paths[CENSUS_PATH] = {
        "get": {
            "operationId": "census",
            "summary": "per partition with a projection on this server: rows and bytes by key family, the work left, "
            "the rows kept to a horizon, within and past it, and the domains at a cap (reads every row; inspect on "
            "every domain)",
            "parameters": [
                {
                    "name": PARTITION_QUERY,
                    "in": "query",
                    "required": False,
                    "description": "only this partition (404 when it has no projection on this server)",
                    "schema": {"type": "integer"},
                }
            ],
            "responses": {
                "200": {
                    "description": '{"partitions": [census, ...]}, each as keyload.sdk.results.Census',
                    "content": _json_object({"partitions": {"type": "array", "items": {"type": "object"}}}),
                },
                "default": _refused(),
            },
        }
    }
    up = {"description": "up", "content": _json_object({"status": {"type": "string", "enum": ["ok"]}})}
    paths["/healthz"] = {"get": {"operationId": "healthz", "security": [], "responses": {"200": up}}}
    paths["/readyz"] = {"get": {"operationId": "readyz", "security": [], "responses": readiness}}
    paths[OPENAPI_PATH] = {
        "get": {
            "operationId": "openapi",
            "security": [],
            "summary": "this document, as checked in at docs/openapi.json",
            "responses": {"200": {"description": "the OpenAPI document", "content": {"application/json": {}}}},
        }
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "keyload",
            "version": __version__,
            "description": "keyload's HTTP API: one operation per command (docs/ARCHITECTURE.md §10a). Bytes are "
            "base64 in JSON; an optional field is null or its value; a union of records is an object with one "
            "member named by the record.",
        },
        "security": [{"bearer": []}],
        "paths": dict(sorted(paths.items())),
        "components": _components(refs),
    }


def text() -> str:
    """The document as checked in: sorted keys, two-space indents, one trailing newline."""
    return json.dumps(document(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    sys.stdout.write(text())
