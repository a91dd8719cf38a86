"""Bad input never wedges a partition: it is rejected or recorded as poison, and the log goes on."""

from __future__ import annotations

from keyload import limits
from keyload.log.codec import REGISTRY
from keyload.projections import keys

from .support import CREATE_QUEUE, ENQUEUE, INSPECT_QUEUE, Embedded, command, create_queue_body, enqueue_body

D = "acme"


def poison_entries(embedded: Embedded) -> list[dict[str, object]]:
    rows = embedded.store(D).scan(keys.POISON, keys.prefix_end(keys.POISON))
    return [REGISTRY.decode("keyload.PoisonEntry", value) for _, value in rows]


def test_bad_records_are_recorded_and_the_commands_after_them_apply(embedded: Embedded) -> None:
    embedded.submit(D, CREATE_QUEUE, create_queue_body("jobs", max_stored_messages=1))
    good = command(D, ENQUEUE, enqueue_body("jobs", "m1"))
    garbage_offset = embedded.append(D, b"\x00garbage bytes that are not Avro")
    unknown_offset = embedded.append(D, good[:2] + b"\x01" * 8 + good[10:])
    truncated_offset = embedded.append(D, good[:15])

    oversize = embedded.submit(D, ENQUEUE, enqueue_body("jobs", "big", b"x" * (limits.MAX_INLINE_BODY_BYTES + 1)))
    bad_queue = embedded.submit(D, CREATE_QUEUE, create_queue_body("no spaces allowed"))
    bad_domain = embedded.submit("Not A Domain", CREATE_QUEUE, create_queue_body("jobs"))
    accepted = embedded.submit(D, ENQUEUE, enqueue_body("jobs", "m1"))
    over_quota = embedded.submit(D, ENQUEUE, enqueue_body("jobs", "m2"))

    assert [p["offset"] for p in poison_entries(embedded)] == [garbage_offset, unknown_offset, truncated_offset]
    reasons = [str(p["reason"]) for p in poison_entries(embedded)]
    assert "not an Avro single-object" in reasons[0]
    assert "unknown writer schema fingerprint" in reasons[1]
    assert "malformed" in reasons[2]
    assert (oversize.error_code, bad_queue.error_code, over_quota.error_code) == (
        "Validation",
        "Validation",
        "ResourceExhausted",
    )
    assert bad_domain.error_code == "Validation" and "domain" in bad_domain.detail
    assert accepted.status == "committed"
    # Rejections are durable outcomes, stored like any other.
    assert embedded.stored_outcome(D, oversize.command_id) is not None
    # Errors never echo payloads.
    assert "xxxx" not in oversize.detail
    view = embedded.submit(D, INSPECT_QUEUE, {"queue": "jobs"}).result
    assert view.counters.stored_messages == 1  # type: ignore[union-attr]


def test_a_command_in_the_wrong_partition_is_rejected(embedded: Embedded) -> None:
    other = next(d for d in (f"d{i}" for i in range(100)) if embedded.partition(d) != embedded.partition(D))
    value = command(other, CREATE_QUEUE, create_queue_body("jobs"), "misrouted", reply_to=0)
    [position] = embedded.log.append(embedded.partition(D), [value])
    embedded.run()
    stored = embedded.store(D).get(keys.outcome(other, "misrouted"))  # stored where it was applied
    assert stored is not None
    outcome = REGISTRY.decode("keyload.Outcome", stored[32:])
    assert outcome["offset"] == position.offset
    assert (outcome["error_code"], outcome["detail"]) == ("Validation", "domain does not belong to this partition")


def test_an_unreadable_command_id_is_poison_not_an_outcome(embedded: Embedded) -> None:
    embedded.append(D, command(D, CREATE_QUEUE, create_queue_body("jobs"), "id with spaces"))
    embedded.append(D, command(D, CREATE_QUEUE, create_queue_body("jobs"), "x" * (limits.MAX_COMMAND_ID_CHARS + 1)))
    embedded.run()
    assert [p["reason"] for p in poison_entries(embedded)] == [
        "command id is not 1..128 printable ASCII characters"
    ] * 2
    assert embedded.submit(D, CREATE_QUEUE, create_queue_body("jobs")).status == "committed"


def test_an_invalid_domain_is_rejected_and_the_partition_goes_on(embedded: Embedded) -> None:
    """Even a domain too long to key anything by gets a (published, unstored) Validation outcome."""
    from .support import INSPECT_QUEUE as INSPECT

    for domain in ("a" * 300, "é" * 200, "UPPER", ""):
        value = command(domain, INSPECT, {"queue": "jobs"}, f"bad-{len(domain)}", reply_to=0)
        embedded.log.append(embedded.partition(D), [value])
    embedded.run()
    published = [REGISTRY.decode("keyload.Outcome", r.value) for r in embedded.outcomes.read(0, 0, 100)]
    assert [(o["status"], o["error_code"]) for o in published] == [("rejected", "Validation")] * 4
    assert all("domain must be" in o["detail"] for o in published)
    assert embedded.submit(D, CREATE_QUEUE, create_queue_body("jobs")).status == "committed"


def test_client_strings_are_never_echoed_in_details(embedded: Embedded) -> None:
    from .support import INSPECT_MESSAGE

    secret = "secret-token-abc"
    embedded.submit(D, CREATE_QUEUE, create_queue_body("jobs"))
    huge_name = "\x00" * (2 * 1024 * 1024)
    outcomes = [
        embedded.submit(D, ENQUEUE, enqueue_body(secret, "m1")),
        embedded.submit(D, ENQUEUE, enqueue_body(huge_name, "m1")),
        embedded.submit(D, INSPECT_MESSAGE, {"queue": "jobs", "message_id": secret, "include_body": False}),
    ]
    embedded.submit(D, ENQUEUE, enqueue_body("jobs", secret))
    outcomes.append(embedded.submit(D, ENQUEUE, enqueue_body("jobs", secret)))
    assert [o.error_code for o in outcomes] == ["NotFound", "Validation", "NotFound", "Conflict"]
    for outcome in outcomes:
        assert secret not in outcome.detail and len(outcome.detail) <= limits.MAX_DETAIL_CHARS


def test_trailing_bytes_after_a_command_are_poison(embedded: Embedded) -> None:
    value = command(D, CREATE_QUEUE, create_queue_body("jobs"), "with-tail")
    offset = embedded.append(D, value + b"\x00\x00")
    embedded.run()
    [entry] = poison_entries(embedded)
    assert entry["offset"] == offset and "trailing bytes" in str(entry["reason"])
