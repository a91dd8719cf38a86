"""Atomic batches: an ordered list of mutations applied all or nothing (DESIGN.md §4).

Each mutation is an existing command body handled by that command's own handler,
so a document put, an enqueue or a publish inside a batch behaves exactly as on
its own. They run in order on the command's stage: a later mutation sees the
earlier ones, and a refusal anywhere drops the stage, so nothing applies. The
refusal names the failing mutation (`failed_index`) and keeps its code.

Processing commands (processors/documents/inbox.py) apply their effects the same way and
tell apart a repeat from a different use of an inbox key by `effects_digest`.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable
from typing import Any, cast

from keyload import limits
from keyload.bodies import BODY_TYPES, Batch, BatchMutation
from keyload.commands import COMMANDS, part_refused
from keyload.log.codec import Record
from keyload.processors.context import Context
from keyload.processors.errors import ErrorCode, Rejected
from keyload.projections.store import Staged

Handler = Callable[[Staged, Any, Context], Record]

# Each mutation kind (a batchable row of the command table): its handler and the result branch it
# returns (the same as the command's).
MUTATIONS: dict[str, tuple[Handler, str]] = {
    kind.branch: (cast(Handler, kind.resolve()), kind.result) for kind in COMMANDS if kind.batchable
}


def check_domains(mutations: list[BatchMutation], ctx: Context, at_least: int = 1) -> None:
    """Refuse, before any effect, a list that is too short (a Batch needs a mutation; a processing
    may have no effects), too long, or names another domain."""
    if not at_least <= len(mutations) <= limits.MAX_BATCH_MUTATIONS:
        raise Rejected(ErrorCode.VALIDATION, f"{at_least}..{limits.MAX_BATCH_MUTATIONS} mutations are allowed")
    for index, mutation in enumerate(mutations):
        if mutation.domain not in (None, ctx.domain):
            raise Rejected(
                ErrorCode.VALIDATION,
                f"mutation {index} names another domain: everything a command touches is in its own domain",
                index,
            )


def apply_mutations(stage: Staged, mutations: list[BatchMutation], ctx: Context) -> Record:
    """Apply every mutation in order (checked by `check_domains`, authorized by processors/access.py);
    a BatchResult, or the first refusal with its index."""
    results = []
    for index, mutation in enumerate(mutations):
        kind, body = mutation.mutation
        handler, result_type = MUTATIONS[kind]
        try:
            result = handler(stage, BODY_TYPES[kind].from_avro(body), ctx)
        except Rejected as refusal:
            raise Rejected(refusal.code, part_refused(index, refusal.detail), index) from None
        results.append((result_type, result))
    return {"results": results}


def batch(stage: Staged, body: Batch, ctx: Context) -> Record:
    check_domains(body.mutations, ctx)
    return apply_mutations(stage, body.mutations, ctx)


def effects_digest(mutations: list[BatchMutation]) -> bytes:
    """SHA-256 over the effects' canonical JSON: keys sorted, null fields and the (checked)
    domain left out, bytes as {"b64": …}, union values as [branch, value]. Leaving nulls
    out keeps the digest of old effects when a later schema adds an optional field. It is over
    each mutation's raw union value (the decoded branch and body dict), not a typed body, so
    typing the bodies leaves every stored digest as it was."""
    canonical = [_canonical(mutation.mutation) for mutation in mutations]
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).digest()


def _canonical(value: Any) -> Any:
    if isinstance(value, dict):
        return {name: _canonical(item) for name, item in value.items() if item is not None}
    if isinstance(value, tuple):
        return [value[0], _canonical(value[1])]
    if isinstance(value, list):
        return [_canonical(item) for item in value]
    if isinstance(value, bytes):
        return {"b64": base64.b64encode(value).decode("ascii")}
    assert value is None or isinstance(value, (str, int, bool)), type(value)
    return value
