"""Documents through the real processor, file log and RocksDB (DESIGN.md §7, processors/documents/document.py):
conditional writes, revisions that only grow, tombstones, key rules, listing pages and domains."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from keyload import limits
from keyload.log.codec import REGISTRY
from keyload.processors.apply import FINGERPRINT_BYTES
from keyload.sdk.results import Document, DocumentPage, DocumentResult, Outcome

from .support import (
    DELETE_DOCUMENT,
    GET_DOCUMENT,
    LIST_DOCUMENTS,
    PUT_DOCUMENT,
    Embedded,
    assert_replay_equals_live,
    command,
    delete_document_body,
    expect,
    list_documents_body,
    put_document_body,
    run_keyload,
    start_service,
    stop_service,
    submit_unhalted,
)

D = "acme"


def put(embedded: Embedded, key: str, value: bytes = b"v", expected: int | None = None, domain: str = D) -> Outcome:
    return submit_unhalted(embedded, domain, PUT_DOCUMENT, put_document_body(key, value, expected))


def delete(embedded: Embedded, key: str, expected: int | None = None, domain: str = D) -> Outcome:
    return submit_unhalted(embedded, domain, DELETE_DOCUMENT, delete_document_body(key, expected))


def get(embedded: Embedded, key: str, domain: str = D) -> Outcome:
    return submit_unhalted(embedded, domain, GET_DOCUMENT, {"key": key})


def written(outcome: Outcome) -> DocumentResult:
    result = expect(outcome, None)
    assert isinstance(result, DocumentResult)
    return result


def document(embedded: Embedded, key: str, domain: str = D) -> Document:
    result = expect(get(embedded, key, domain), None)
    assert isinstance(result, Document)
    return result


def listing(embedded: Embedded, domain: str = D, **fields: Any) -> DocumentPage:
    result = expect(submit_unhalted(embedded, domain, LIST_DOCUMENTS, list_documents_body(**fields)), None)
    assert isinstance(result, DocumentPage)
    return result


def all_pages(embedded: Embedded, **fields: Any) -> list[DocumentPage]:
    """Every page of a listing, following next_after until it is null."""
    pages = [listing(embedded, **fields)]
    while pages[-1].next_after is not None:
        assert len(pages) < 100, "a listing that never ends"
        pages.append(listing(embedded, **dict(fields, after=pages[-1].next_after)))
    return pages


def rejected(outcome: Outcome, code: str) -> str:
    expect(outcome, code)
    return outcome.detail


def write_quickly(embedded: Embedded, kind: str, bodies: list[dict[str, Any]]) -> None:
    """Append many commands, apply them in one go, and check that each committed."""
    ids = [str(uuid.uuid4()) for _ in bodies]
    for command_id, body in zip(ids, bodies, strict=True):
        embedded.append(D, command(D, kind, body, command_id))
    embedded.run()
    for command_id in ids:
        stored = embedded.stored_outcome(D, command_id)
        assert stored is not None
        assert REGISTRY.decode("keyload.Outcome", stored[FINGERPRINT_BYTES:])["status"] == "committed"


# -- conditional writes ---------------------------------------------------------------------


def test_put_expecting_absent_exact_or_any_revision(embedded: Embedded) -> None:
    assert written(put(embedded, "order/1", b"a", expected=0)) == DocumentResult(
        key="order/1", revision=1, deleted=False
    )
    detail = rejected(put(embedded, "order/1", b"b", expected=0), "RevisionConflict")
    assert detail == "the document exists at revision 1"
    assert written(put(embedded, "order/1", b"b", expected=1)).revision == 2
    # A writer still holding revision 1 is refused, and told where the document is.
    detail = rejected(put(embedded, "order/1", b"stale", expected=1), "RevisionConflict")
    assert detail == "the document is at revision 2, not at revision 1"
    embedded.now_ms += 5_000
    assert written(put(embedded, "order/1", b"c")).revision == 3  # unconditional
    assert document(embedded, "order/1") == Document(
        key="order/1", value=b"c", revision=3, updated_at_ms=embedded.now_ms
    )
    detail = rejected(put(embedded, "order/2", b"x", expected=4), "RevisionConflict")
    assert detail == "the document is absent, not at revision 4"
    rejected(get(embedded, "order/2"), "NotFound")
    rejected(put(embedded, "order/1", b"x", expected=-1), "Validation")
    assert document(embedded, "order/1").value == b"c"


def test_a_retried_put_returns_its_first_outcome_without_writing_again(embedded: Embedded) -> None:
    body = put_document_body("k", b"once", None)
    first = submit_unhalted(embedded, D, PUT_DOCUMENT, body, command_id="put-1")
    again = submit_unhalted(embedded, D, PUT_DOCUMENT, body, command_id="put-1")
    assert written(first) == written(again) == DocumentResult(key="k", revision=1, deleted=False)
    assert document(embedded, "k").revision == 1
    other = submit_unhalted(embedded, D, PUT_DOCUMENT, put_document_body("k", b"other"), command_id="put-1")
    rejected(other, "Conflict")


def test_delete_with_and_without_an_expected_revision(embedded: Embedded) -> None:
    assert rejected(delete(embedded, "gone"), "NotFound") == "document does not exist"
    rejected(delete(embedded, "gone", expected=1), "RevisionConflict")
    written(put(embedded, "a", b"1"))
    written(put(embedded, "a", b"2"))
    written(put(embedded, "b", b"1"))
    assert rejected(delete(embedded, "a", expected=1), "RevisionConflict").endswith("not at revision 1")
    rejected(delete(embedded, "a", expected=0), "Validation")  # a delete needs a document to remove
    assert document(embedded, "a").value == b"2"
    # The result names the revision the delete removed.
    assert written(delete(embedded, "a", expected=2)) == DocumentResult(key="a", revision=2, deleted=True)
    assert written(delete(embedded, "b")) == DocumentResult(key="b", revision=1, deleted=True)
    for key in ("a", "b"):
        assert rejected(get(embedded, key), "NotFound") == "document does not exist"
        rejected(delete(embedded, key), "NotFound")
    # A deleted document is absent to a conditional delete too.
    assert rejected(delete(embedded, "a", expected=2), "RevisionConflict") == (
        "the document is absent, not at revision 2"
    )


def test_revisions_keep_growing_across_delete_and_recreate(embedded: Embedded) -> None:
    written(put(embedded, "k", b"v1"))
    written(put(embedded, "k", b"v2"))
    assert written(delete(embedded, "k")).revision == 2  # its tombstone holds revision 3
    # Re-created: "absent" holds, and the revision continues past the tombstone's.
    assert written(put(embedded, "k", b"new", expected=0)).revision == 4
    # Writers holding the old document's revisions (or the tombstone's) are refused.
    for held in (1, 2, 3):
        rejected(put(embedded, "k", b"lost update", expected=held), "RevisionConflict")
        rejected(delete(embedded, "k", expected=held), "RevisionConflict")
    assert document(embedded, "k").value == b"new"
    written(delete(embedded, "k"))
    assert written(put(embedded, "k", b"again")).revision == 6
    assert document(embedded, "k").revision == 6


# -- validation -----------------------------------------------------------------------------

BAD_KEYS = ["", "k" * (limits.MAX_DOCUMENT_KEY_CHARS + 1), "has space", "tab\tbed", "line\nbreak", "nul\x00", "é"]


@pytest.mark.parametrize("key", BAD_KEYS, ids=["empty", "too-long", "space", "tab", "newline", "nul", "non-ascii"])
def test_key_rules(embedded: Embedded, key: str) -> None:
    before = embedded.state_digest(D)
    rejected(put(embedded, key), "Validation")
    rejected(delete(embedded, key), "Validation")
    rejected(get(embedded, key), "Validation")
    if key:
        rejected(submit_unhalted(embedded, D, LIST_DOCUMENTS, list_documents_body(after=key)), "Validation")
        rejected(submit_unhalted(embedded, D, LIST_DOCUMENTS, list_documents_body(prefix=key)), "Validation")
    assert embedded.state_digest(D) == before


def test_the_longest_key_and_the_largest_value_are_accepted(embedded: Embedded) -> None:
    key = "k" * limits.MAX_DOCUMENT_KEY_CHARS
    largest = b"x" * limits.MAX_DOCUMENT_BYTES
    assert written(put(embedded, key, largest)).revision == 1
    assert document(embedded, key).value == largest
    before = embedded.state_digest(D)
    detail = rejected(put(embedded, key, largest + b"x"), "Validation")
    assert detail == f"a document value holds at most {limits.MAX_DOCUMENT_BYTES} bytes"
    assert embedded.state_digest(D) == before
    assert document(embedded, key).revision == 1


@pytest.mark.parametrize(
    ("fields", "what"),
    [
        ({"prefix": "a/", "after": "b/1"}, "after must start with the prefix"),
        ({"max_documents": 0}, "max_documents"),
        ({"max_documents": limits.MAX_LIST_DOCUMENTS + 1}, "max_documents"),
        ({"max_bytes": 0}, "max_bytes"),
        ({"max_bytes": limits.MAX_LIST_BYTES + 1}, "max_bytes"),
    ],
)
def test_list_validation(embedded: Embedded, fields: dict[str, Any], what: str) -> None:
    outcome = submit_unhalted(embedded, D, LIST_DOCUMENTS, list_documents_body(**fields))
    assert what in rejected(outcome, "Validation")


# -- listing ----------------------------------------------------------------------------------


def test_list_pages_by_prefix_and_after_and_skips_tombstones(embedded: Embedded) -> None:
    orders = [f"order/{i:02d}" for i in range(25)]
    for key in ["order", "orders", "ordex/1", "other", *orders]:
        written(put(embedded, key, key.encode()))
    for key in ("order/03", "order/10", "order/11", "order/24"):
        written(delete(embedded, key))
    live = [k for k in orders if k not in ("order/03", "order/10", "order/11", "order/24")]

    pages = all_pages(embedded, prefix="order/", max_documents=7)
    assert [len(p.documents) for p in pages] == [7, 7, 7]
    assert [d.key for p in pages for d in p.documents] == live
    assert all(d.value == d.key.encode() and d.revision == 1 for p in pages for d in p.documents)
    assert not any(p.budget_exhausted for p in pages)
    assert pages[0].next_after == "order/07"  # the last document the page holds
    assert pages[-1].next_after is None

    # A page that ends on the last live document, with only tombstones after it, says so.
    assert listing(embedded, prefix="order/", after="order/20").next_after is None
    # `after` need not name a document, and is exclusive.
    page = listing(embedded, prefix="order/", after="order/09", max_documents=2)
    assert [d.key for d in page.documents] == ["order/12", "order/13"]
    # Without a prefix: the whole domain in byte order ("/" sorts before "s" and "x").
    everything = [d.key for p in all_pages(embedded, max_documents=10) for d in p.documents]
    assert everything == ["order", *live, "orders", "ordex/1", "other"]
    assert [d.key for d in listing(embedded, prefix="orde").documents][-2:] == ["orders", "ordex/1"]
    assert listing(embedded, prefix="zzz") == DocumentPage(documents=[], next_after=None, budget_exhausted=False)


def test_list_stops_at_max_bytes_but_always_returns_the_first_document(embedded: Embedded) -> None:
    for i in range(5):
        written(put(embedded, f"d{i}", bytes([65 + i]) * 100))
    pages = all_pages(embedded, max_bytes=250)
    assert [[d.key for d in p.documents] for p in pages] == [["d0", "d1"], ["d2", "d3"], ["d4"]]
    # A limit below every value still makes progress: one document a page.
    pages = all_pages(embedded, max_bytes=1)
    assert [[d.key for d in p.documents] for p in pages] == [["d0"], ["d1"], ["d2"], ["d3"], ["d4"]]
    assert listing(embedded, max_bytes=500).next_after is None


def test_list_examines_at_most_the_budget_of_rows_tombstones_included(embedded: Embedded) -> None:
    dead = [f"dead/{i:04d}" for i in range(limits.LIST_EXAMINATION_BUDGET + 44)]
    write_quickly(embedded, PUT_DOCUMENT, [put_document_body(k) for k in dead])
    write_quickly(embedded, DELETE_DOCUMENT, [delete_document_body(k) for k in dead])
    written(put(embedded, "dead/zz-alive", b"here"))

    first = listing(embedded, prefix="dead/")
    assert first == DocumentPage(
        documents=[], next_after=dead[limits.LIST_EXAMINATION_BUDGET - 1], budget_exhausted=True
    )
    second = listing(embedded, prefix="dead/", after=first.next_after)
    assert ([d.key for d in second.documents], second.next_after, second.budget_exhausted) == (
        ["dead/zz-alive"],
        None,
        False,
    )


def test_domains_are_isolated(embedded: Embedded) -> None:
    partition = embedded.partition(D)
    same = next(f"d{i}" for i in range(1_000) if embedded.partition(f"d{i}") == partition)
    other = next(f"d{i}" for i in range(1_000) if embedded.partition(f"d{i}") != partition)
    # "acme" and "acme2" share a byte prefix: their documents must not.
    for domain in (D, "acme2", same, other):
        assert written(put(embedded, "shared", domain.encode(), expected=0, domain=domain)).revision == 1
    written(put(embedded, "shared", b"acme again", expected=1))
    written(delete(embedded, "shared"))
    rejected(get(embedded, "shared"), "NotFound")
    assert listing(embedded) == DocumentPage(documents=[], next_after=None, budget_exhausted=False)
    for domain in ("acme2", same, other):
        assert (document(embedded, "shared", domain).value, document(embedded, "shared", domain).revision) == (
            domain.encode(),
            1,
        )
        assert [d.key for d in listing(embedded, domain).documents] == ["shared"]


def test_replay_rebuilds_the_documents(embedded: Embedded, tmp_path: Path) -> None:
    for i in range(6):
        written(put(embedded, f"k{i % 3}", bytes([i])))
        embedded.now_ms += 10
    written(delete(embedded, "k1"))
    rejected(put(embedded, "k2", b"x", expected=1), "RevisionConflict")
    assert_replay_equals_live(embedded, D, tmp_path)


# -- the command line ---------------------------------------------------------------------------


@pytest.mark.slow
def test_doc_commands_against_a_running_service(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    service = start_service(tmp_path / "data", "--partitions", "2")

    def doc(*args: str, code: int = 0) -> Any:
        result = run_keyload("doc", args[0], "--data", data, "--domain", D, *args[1:])
        assert result.returncode == code, result
        if code:
            lines = result.stderr.strip().splitlines()
            assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
            return lines[0]
        return json.loads(result.stdout)

    try:
        assert doc("put", "order/1", "--body", "hello", "--expected-revision", "0") == {
            "key": "order/1",
            "revision": 1,
            "deleted": False,
        }
        assert "RevisionConflict" in doc("put", "order/1", "--body", "x", "--expected-revision", "0", code=1)
        assert doc("put", "order/2", "--body", "world")["revision"] == 1
        got = doc("get", "order/1")
        assert (got["key"], got["value"], got["revision"]) == ("order/1", "hello", 1)
        page = doc("list", "order/", "--max-documents", "1")
        assert ([d["key"] for d in page["documents"]], page["next_after"]) == (["order/1"], "order/1")
        page = doc("list", "order/", "--after", "order/1")
        assert ([d["value"] for d in page["documents"]], page["next_after"]) == (["world"], None)
        assert doc("delete", "order/1", "--expected-revision", "1")["deleted"] is True
        assert "NotFound" in doc("get", "order/1", code=1)
        assert "Validation" in doc("put", "bad key", "--body", "x", code=1)
        configured = run_keyload(
            "inbox", "configure", "--data", data, "--domain", D, "--max-receipts", "5", "--max-bytes", "9000"
        )
        assert configured.returncode == 0, configured
        assert json.loads(configured.stdout) == {
            "domain": D,
            "max_receipts": 5,
            "max_bytes": 9000,
            "receipts": 0,
            "bytes": 0,
        }
    finally:
        assert stop_service(service) == 0
