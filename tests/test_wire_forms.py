"""The JSON form of commands and outcomes (keyload/wire.py) over every record the registry decodes:
plain JSON, and `to_avro` of it gives the record back, so the converter built once per schema and the
request-side checks agree on every rule of the form."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.responses import JSONResponse

from keyload.log.codec import REGISTRY
from keyload.server.app import AnswerJSON
from keyload.wire import WireError, field_schema, names, to_avro, to_json

from .avro_values import named_types, values
from .support import ENQUEUE, command, enqueue_body, outcome_json

TOPS = ("keyload.Command", "keyload.Outcome")


@pytest.mark.parametrize("top", TOPS)
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_json_form_of_a_decoded_record_is_json_and_converts_back_to_it(top: str, data: st.DataObject) -> None:
    schema = REGISTRY.schema(top)
    datum = REGISTRY.decode(top, REGISTRY.encode(top, data.draw(values(schema, named_types(schema, {})))))
    names_ = names(top)
    form = to_json(names_, names_.types[top], datum)
    assert json.loads(json.dumps(form)) == form
    assert to_avro(names_, names_.types[top], form, "") == datum


def test_the_json_form_follows_the_rules() -> None:
    """Bytes as padded base64, a union of several records as a one-member object named by the
    record's short name, an optional value as itself or null, records in schema field order."""
    names_ = names("keyload.Command")
    top = names_.types["keyload.Command"]
    encoded = command("d", ENQUEUE, enqueue_body("q", "m-1", bytes(range(32))), command_id="c-1", reply_to=None)
    form = to_json(names_, top, REGISTRY.decode("keyload.Command", encoded))
    assert list(form) == [field["name"] for field in top["fields"]]
    assert (form["command_id"], form["reply_to"]) == ("c-1", None)
    ((member, enqueue),) = form["body"].items()
    assert member == "Enqueue"
    assert enqueue["body"] == "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="
    assert (enqueue["queue"], enqueue["message_id"], enqueue["headers"], enqueue["ordering_key"]) == (
        "q",
        "m-1",
        {},
        None,
    )


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(value=JSON_VALUES)
def test_answers_are_the_bytes_starlette_writes(value: object) -> None:
    assert AnswerJSON(value).body == JSONResponse(value).body


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_an_outcome_is_answered_with_the_bytes_starlette_writes(data: st.DataObject) -> None:
    schema = REGISTRY.schema("keyload.Outcome")
    datum = REGISTRY.decode(
        "keyload.Outcome", REGISTRY.encode("keyload.Outcome", data.draw(values(schema, named_types(schema, {}))))
    )
    names_ = names("keyload.Outcome")
    form = to_json(names_, names_.types["keyload.Outcome"], datum)
    assert AnswerJSON(form).body == JSONResponse(form).body


def _enqueue(**fields: object) -> dict[str, object]:
    return {"mutations": [{"mutation": {"Enqueue": fields}}]}


AT = "mutations[0].mutation.Enqueue"


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ([], "the body must be a JSON object"),
        ({"mutations": {}}, "mutations must be a JSON array"),
        (_enqueue(queue="q", message_id="m", body="!"), f"{AT}.body is not valid base64"),
        (_enqueue(queue="q", message_id="m", body=7), f"{AT}.body must be a base64 string"),
        (_enqueue(queue="q", body="AA=="), f"{AT}.message_id is required"),
        (_enqueue(queue="q", message_id="m", bodyy=""), f"{AT}.bodyy is not a field of Enqueue"),
        (_enqueue(queue=1, message_id="m", body=""), f"{AT}.queue must be a string"),
        (_enqueue(queue="q", message_id="m", body="", headers={"trace": 1}), f"{AT}.headers.trace must be a string"),
        (
            {"mutations": [{"mutation": {"Enqueuee": {}}}]},
            "mutations[0].mutation must be an object with one member, one of PutDocument, DeleteDocument, Enqueue, "
            "Publish, Cancel, Redrive, ParkPending",
        ),
    ],
)
def test_a_request_that_does_not_fit_is_refused_naming_its_path(body: object, error: str) -> None:
    """The converter built once per schema says where a value does not fit, never the value."""
    names_ = names("keyload.Command")
    with pytest.raises(WireError) as refused:
        to_avro(names_, names_.types["keyload.command.Batch"], body, "")
    assert str(refused.value) == error


def test_the_path_given_leads_the_one_reported() -> None:
    names_ = names("keyload.Command")
    with pytest.raises(WireError, match=r"^body\.Enqueue\.queue must be a string$"):
        to_avro(names_, field_schema(names_, "keyload.Command", "body"), {"Enqueue": {"queue": 1}}, "body")


def test_a_reader_of_results_leaves_out_fields_its_schema_lacks_and_a_request_may_not_have_them() -> None:
    """A newer server's outcome (here: a GroupTokenResult and the outcome itself with a field this
    schema lacks) converts for the SDK's reader as it would without them, and an enum symbol this
    schema lacks is kept as its string; the strict form, which requests go through, refuses both,
    naming the field."""
    token = {"status": "committed", "position": 3, "checkpoint": 3}
    answer = outcome_json(result={"GroupAckBatchResult": {"results": [token], "checkpoint": 3}})
    newer = {
        **answer,
        "result": {"GroupAckBatchResult": {"results": [{**token, "acked_by": "w-1"}], "checkpoint": 3}},
        "served_by": "node-2",
    }
    reader, strict = names("keyload.Outcome", reader=True), names("keyload.Outcome")
    top = strict.types["keyload.Outcome"]
    assert to_avro(reader, reader.types["keyload.Outcome"], newer, "") == to_avro(strict, top, answer, "")
    with pytest.raises(WireError, match="is not a field of"):
        to_avro(strict, top, newer, "")
    refused = {**answer, "status": "rejected", "error_code": "QueueFrozen", "result": None}
    assert to_avro(reader, reader.types["keyload.Outcome"], refused, "")["error_code"] == "QueueFrozen"
    with pytest.raises(WireError, match=r"^error_code must be one of Validation, "):
        to_avro(strict, top, refused, "")
