"""Documents: per-domain key → value with a revision, the database effects of processing (DESIGN.md §7).

A write is conditional on the revision the writer read (`expected_revision`: null
unconditional, 0 absent, n exactly n). Revisions only grow: a delete leaves a
tombstone carrying the revision, so a writer holding revision n of a deleted and
re-created document is refused rather than overwriting the new one. From feature
level 4 that holds within the domain's receipt horizon: the tombstone goes then
(processors/horizons.py), unless the document is written again first, and a document
created under the absent key starts at revision 1 again.
"""

from __future__ import annotations

from keyload import limits
from keyload.bodies import DeleteDocument, GetDocument, ListDocuments, PutDocument
from keyload.log.codec import Record
from keyload.processors import horizons, usage, validation
from keyload.processors.context import Context
from keyload.processors.errors import ErrorCode, Rejected
from keyload.processors.features import WORK_COMPACTED, feature_level
from keyload.processors.queues.state import bounded, check_name
from keyload.projections import keys
from keyload.projections.records import DocumentRecord, load, save
from keyload.projections.store import Staged


def _check_key(key: str) -> None:
    check_name("document key", key, limits.MAX_DOCUMENT_KEY_CHARS, limits.ID_PATTERN)


def _check_expected(stored: DocumentRecord | None, expected: int | None, kind: str) -> None:
    """RevisionConflict unless the document is as the writer of a `kind` command (PutDocument,
    DeleteDocument) expects (see the module docstring)."""
    if expected is None:
        return
    validation.check_integer(f"{kind}.expected_revision", expected)
    live = None if stored is None or stored.deleted else stored.revision
    if expected == 0 and live is not None:
        raise Rejected(ErrorCode.REVISION_CONFLICT, f"the document exists at revision {live}")
    if expected > 0 and live != expected:
        found = "is absent" if live is None else f"is at revision {live}"
        raise Rejected(ErrorCode.REVISION_CONFLICT, f"the document {found}, not at revision {expected}")


def put_document(stage: Staged, body: PutDocument, ctx: Context) -> Record:
    key = body.key
    _check_key(key)
    if len(body.value) > limits.MAX_DOCUMENT_BYTES:
        raise Rejected(ErrorCode.VALIDATION, f"a document value holds at most {limits.MAX_DOCUMENT_BYTES} bytes")
    row = keys.document(ctx.domain, key)
    stored = load(stage, row, DocumentRecord)
    _check_expected(stored, body.expected_revision, "PutDocument")
    revision = 1 if stored is None else stored.revision + 1
    live = stored is not None and not stored.deleted
    growth = len(body.value) - (len(stored.value) if stored is not None and live else 0)
    usage.charge(stage, ctx.domain, row, documents=0 if live else 1, document_bytes=growth)
    save(stage, row, DocumentRecord(value=body.value, revision=revision, updated_at_ms=ctx.now_ms, deleted=False))
    return {"key": key, "revision": revision, "deleted": False}


def delete_document(stage: Staged, body: DeleteDocument, ctx: Context) -> Record:
    key = body.key
    _check_key(key)
    row = keys.document(ctx.domain, key)
    stored = load(stage, row, DocumentRecord)
    if body.expected_revision == 0:
        raise Rejected(ErrorCode.VALIDATION, "a delete's expected_revision must be at least 1 (or none)")
    _check_expected(stored, body.expected_revision, "DeleteDocument")
    if stored is None or stored.deleted:
        raise Rejected(ErrorCode.NOT_FOUND, "document does not exist")
    tombstone = DocumentRecord(value=b"", revision=stored.revision + 1, updated_at_ms=ctx.now_ms, deleted=True)
    usage.charge(stage, ctx.domain, row, documents=-1, document_bytes=-len(stored.value))
    save(stage, row, tombstone)
    if feature_level(stage) >= WORK_COMPACTED:
        horizons.keep_tombstone_until_receipt_horizon(stage, row, tombstone, ctx.domain)
    return {"key": key, "revision": stored.revision, "deleted": True}


def _view(key: str, document: DocumentRecord) -> Record:
    return {"key": key, "value": document.value, "revision": document.revision, "updated_at_ms": document.updated_at_ms}


def get_document(stage: Staged, body: GetDocument, ctx: Context) -> Record:
    key = body.key
    _check_key(key)
    stored = load(stage, keys.document(ctx.domain, key), DocumentRecord)
    if stored is None or stored.deleted:
        raise Rejected(ErrorCode.NOT_FOUND, "document does not exist")
    return _view(key, stored)


def list_documents(stage: Staged, body: ListDocuments, ctx: Context) -> Record:
    """Live documents under `prefix` in key order, after `after`.

    The page ends at `max_documents`, at `max_bytes` of values (the first document
    always goes), or after LIST_EXAMINATION_BUDGET rows, tombstones included
    (`budget_exhausted`); `next_after` is where to read on, null when nothing is left.
    """
    prefix, after = body.prefix, body.after
    if prefix:
        check_name("prefix", prefix, limits.MAX_DOCUMENT_KEY_CHARS, limits.ID_PATTERN)
    if after is not None:
        _check_key(after)
        if not after.startswith(prefix):
            raise Rejected(ErrorCode.VALIDATION, "after must start with the prefix")
    max_documents = bounded(
        "max_documents", body.max_documents, limits.DEFAULT_LIST_DOCUMENTS, 1, limits.MAX_LIST_DOCUMENTS
    )
    max_bytes = bounded("max_bytes", body.max_bytes, limits.DEFAULT_LIST_BYTES, 1, limits.MAX_LIST_BYTES)
    start_prefix = keys.document(ctx.domain, prefix)
    start = start_prefix if after is None else keys.document(ctx.domain, after) + b"\x00"
    documents: list[Record] = []
    size = 0
    budget_hit = full = False
    last: str | None = None
    for examined, (row, _) in enumerate(stage.scan(start, keys.prefix_end(start_prefix))):
        if examined == limits.LIST_EXAMINATION_BUDGET:
            budget_hit = True
            break
        stored = load(stage, row, DocumentRecord)
        assert stored is not None
        if stored.deleted:
            last = keys.document_key(row)
            continue
        if len(documents) == max_documents or (documents and size + len(stored.value) > max_bytes):
            full = True
            break
        last = keys.document_key(row)
        size += len(stored.value)
        documents.append(_view(last, stored))
    return {"documents": documents, "next_after": last if budget_hit or full else None, "budget_exhausted": budget_hit}
