"""How keyload's error codes map onto HTTP statuses: one table, every code once (a contract)."""

from __future__ import annotations

from keyload.errors import ErrorCode

E = ErrorCode
HTTP_STATUS: dict[ErrorCode, int] = {
    E.VALIDATION: 400,
    E.NOT_FOUND: 404,
    E.CONFLICT: 409,
    E.REVISION_CONFLICT: 409,
    E.PERMISSION_DENIED: 403,
    E.RESOURCE_EXHAUSTED: 429,
    E.STALE_LEASE: 409,
    E.LEASE_EXPIRED: 410,
    E.TOKEN_INVALIDATED: 409,
    E.DISPATCH_PAUSED: 409,
    E.HISTORY_UNAVAILABLE: 410,
    E.DUPLICATE_EVENT_ID: 409,
    E.BUDGET_EXCEEDED: 422,
    E.UNSUPPORTED_CAPABILITY: 501,
    E.CORRUPTION: 503,
    E.RECOVERY_REQUIRED: 503,
}
assert set(HTTP_STATUS) == set(ErrorCode), "every error code has its HTTP status"

# Errors of the HTTP layer itself: the request got no outcome (nothing was appended, or no answer came
# in time). The body names one of these in `error_code`, with `status` "error".
UNAUTHENTICATED = ("Unauthenticated", 401)  # no credential, or one the service does not accept
FORBIDDEN = ("PermissionDenied", 403)  # the caller may not ask the server for this (issuing credentials: admin)
BAD_REQUEST = ("Validation", 400)  # the request does not make a command: bad JSON, a field that does not fit
TOO_LARGE = ("Validation", 413)  # the request body is over MAX_REQUEST_BYTES, or its command over the log's limit
NO_ROUTE = ("NotFound", 404)  # no route has this path
WRONG_METHOD = ("NotFound", 405)  # the path exists for other methods
NOT_SERVED_HERE = ("UnsupportedCapability", 501)  # a Kafka processor's server issues no credentials
GONE = ("Gone", 410)  # a payload handle or reservation past its deadline, or an object no longer stored
UNAVAILABLE = ("Unavailable", 503)  # the partition is halted or cannot take appends now; retry later
TIMEOUT = ("Timeout", 504)  # no outcome in time: retry with the same Idempotency-Key to learn it
INTERNAL = ("Internal", 500)  # a fault of the server's own: the request fails alone; its log says why
HTTP_ERRORS = (
    UNAUTHENTICATED,
    FORBIDDEN,
    BAD_REQUEST,
    TOO_LARGE,
    NO_ROUTE,
    WRONG_METHOD,
    NOT_SERVED_HERE,
    GONE,
    UNAVAILABLE,
    TIMEOUT,
    INTERNAL,
)
