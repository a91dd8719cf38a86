"""Model-based test of access control: random grants, revokes and disables against a reference model,
and random principals sending signed commands, repeats of them and batches.

The model is plain Python written from the documented behaviour (processors/access.py, processors/
principals.py, processors/apply.py, keyload/commands.py), not from the product's `allows`:

- a principal is (enabled, revision, set of grants), a grant (capability, domain pattern, resource
  pattern); a pattern is an exact name, or a prefix ending in '*' ("*" is everything);
- a grant allows its capability, or every one when it is admin, where both patterns match; a
  partition-wide check (InspectPrincipal of another principal) needs admin on ("*", "*");
- a disabled principal is refused everything (authentication: the refusal is published, not
  stored, and not sealed for it);
- an authorization refusal (the capability the table row names, or a Batch mutation's) is published,
  sealed for its sender, and not stored either: a principal without the capability cannot take a
  command id, so a later send under the id (once allowed) applies as a first send, at its offset;
  every command the principals send here is refused, if at all, by its row, never by its handler;
- PutPrincipal, and a grant or revoke that changes something, bump the principal's revision and
  the policy epoch (one per change, EnableAccessControl the first); a no-op grant or revoke, or a
  PutPrincipal refused for its expected revision, changes neither;
- a command id holds a stored outcome exactly when a send under it passed authorization (whatever
  its handler then answered); a send under a stored id is authorized first, against the policy of
  now and for the command it is: refused, a fresh PermissionDenied (also when the id was used for a
  different command: no Conflict to tell the id's use to a principal that may not run the command);
  allowed, the stored outcome as it was (the same offset) for the same command, Conflict for another;
- each mutation of a Batch is authorized as the command it is: the first one the model refuses
  rejects the batch with its index, and nothing of it applies.

A refusal never changes the partition's state (its digest without outcomes); a replay of the log
from offset 0 reaches the live projection.

The tests at the end pin what the machine first found: a repeat of a Batch, or of an
InspectPrincipal of another principal, answered from its stored outcome after the grant that
allowed it was revoked (the repeat's re-authorization checked nothing for a kind with no
capability of its own in the table).
"""

from __future__ import annotations

import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from keyload.commands import Capability
from keyload.credentials import ADMIN_PRINCIPAL, Credential, contents
from keyload.log.codec import REGISTRY
from keyload.projections import keys
from keyload.sdk.results import BatchResult, Outcome, PrincipalView, QueueView
from keyload.service.access_control import enable_command
from keyload.storage.principals import new_credential, system_credential

from .support import (
    BATCH,
    CREATE_QUEUE,
    ENQUEUE,
    INSPECT_QUEUE,
    RECEIVE,
    Embedded,
    batch_body,
    close_after_replay_check,
    command,
    create_queue_body,
    enqueue_body,
    mutation,
    receive_body,
)

GRANT_CAPABILITY = "keyload.command.GrantCapability"
REVOKE_CAPABILITY = "keyload.command.RevokeCapability"
PUT_PRINCIPAL = "keyload.command.PutPrincipal"
INSPECT_PRINCIPAL = "keyload.command.InspectPrincipal"

DENIED = "PermissionDenied"
PRINCIPALS = ("ann", "bob", "cy")
# Names that are prefixes of others, and exact patterns that are prefixes of names, so that an exact
# pattern read as a prefix (or a prefix read as exact) is seen. One partition: every domain on it.
DOMAINS = ("shop", "shopping")
QUEUES = ("q1", "q12", "r1")
DOMAIN_PATTERNS = ("shop", "shopping", "sho", "shop*", "shopp*", "*")
RESOURCE_PATTERNS = ("q1", "q12", "q", "r1", "q*", "q1*", "*")
CAPABILITIES = (
    Capability.enqueue,
    Capability.consume,
    Capability.inspect,
    Capability.resource_manage,
    Capability.admin,
)
ADMIN_DOMAIN = DOMAINS[0]  # the envelope domain of the partition-wide principal commands
# What each single command the principals send needs.
NEEDS = {
    CREATE_QUEUE: Capability.resource_manage,
    ENQUEUE: Capability.enqueue,
    INSPECT_QUEUE: Capability.inspect,
    RECEIVE: Capability.consume,
}

GrantKey = tuple[str, str, str]  # capability, domain pattern, resource pattern


def covers(pattern: str, name: str) -> bool:
    """The model's pattern match: exactly the name, or a '*'-terminated prefix of it."""
    if pattern[-1:] != "*":
        return pattern == name
    stem = pattern[: len(pattern) - 1]
    return name[: len(stem)] == stem


@dataclass
class Principal:
    enabled: bool = True
    revision: int = 1
    grants: set[GrantKey] = field(default_factory=set)


@dataclass
class Policy:
    """The reference model: every principal and the number of policy changes so far (the epoch)."""

    principals: dict[str, Principal] = field(default_factory=dict)
    epoch: int = 1  # EnableAccessControl

    def allows(self, name: str, capability: Capability, domain: str, resource: str) -> bool:
        principal = self.principals[name]
        if not principal.enabled:
            return False
        return any(
            held in (capability.value, Capability.admin.value) and covers(d, domain) and covers(r, resource)
            for held, d, r in principal.grants
        )

    def allows_everywhere(self, name: str, capability: Capability) -> bool:
        """A partition-wide check: only a grant on "*" and "*" counts."""
        principal = self.principals[name]
        return principal.enabled and any(
            held in (capability.value, Capability.admin.value) and (d, r) == ("*", "*")
            for held, d, r in principal.grants
        )


@dataclass
class Sent:
    """A command a principal sent, to send again: its outcome as first stored (None while the
    command id holds no stored outcome: every send under it was refused by authentication or
    authorization)."""

    principal: str
    domain: str
    kind: str
    body: dict[str, Any]
    command_id: str
    stored: Outcome | None


def grant_record(grant: GrantKey) -> dict[str, str]:
    return {"capability": grant[0], "domain": grant[1], "resource": grant[2]}


grants = st.tuples(
    st.sampled_from([c.value for c in CAPABILITIES]),
    st.sampled_from(DOMAIN_PATTERNS),
    st.sampled_from(RESOURCE_PATTERNS),
)
principals = st.sampled_from(PRINCIPALS)
domains = st.sampled_from(DOMAINS)
queues = st.sampled_from(QUEUES)


class AccessMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="keyload-access-model-"))
        root = self.directory / "data"
        self.embedded = Embedded(root, partitions=1)
        self.admin = system_credential(root, ADMIN_PRINCIPAL)
        self.credentials = {name: new_credential(root, name) for name in PRINCIPALS}
        keyring = self.embedded.data.keyring()  # now holding the principals' keys
        for processor in self.embedded.processors:
            processor.keyring = dict(keyring)
        self.embedded.log.append(0, [enable_command(root, 0, 1)])
        self.embedded.run()
        self.model = Policy()
        self.queues: dict[tuple[str, str], int] = {}  # (domain, queue) created -> enqueued_total
        self.sent: list[Sent] = []
        self.ids = 0
        self.check_self_view(self.admin, DOMAINS[0])

    @initialize(initial=st.lists(st.lists(grants, max_size=3), min_size=len(PRINCIPALS), max_size=len(PRINCIPALS)))
    def admin_creates_the_principals(self, initial: list[list[GrantKey]]) -> None:
        """PutPrincipal of each principal, new (expected revision 0), with its first grants."""
        for (name, credential), first in zip(self.credentials.items(), initial, strict=True):
            body = {
                "principal": name,
                "key_id": credential.key_id,
                "enabled": None,
                "grants": [grant_record(grant) for grant in first],
                "expected_revision": 0,
            }
            self.model.principals[name] = Principal(grants=set(first))
            self.model.epoch += 1
            self.check_view(self.admin_sends(PUT_PRINCIPAL, body), name)

    # -- sending --------------------------------------------------------------------------------

    def fresh_id(self) -> str:
        self.ids += 1
        return f"c{self.ids}"

    def send(
        self, credential: Credential, domain: str, kind: str, body: dict[str, Any], command_id: str
    ) -> tuple[Outcome, bool]:
        """Append the command signed by `credential`, apply it: (its outcome, whether the outcome was
        sealed with the credential's key)."""
        cursor = self.embedded.outcomes.end_offset(0)
        raw = command(domain, kind, body, command_id, principal=credential.principal, reply_to=0)
        self.embedded.append(domain, credential.sign(raw))
        self.embedded.run()
        halted = [p.halt for p in self.embedded.processors if p.halt is not None]
        assert not halted, halted
        found = []
        for record in self.embedded.outcomes.read(0, cursor, 1_000):
            decoded = REGISTRY.decode("keyload.Outcome", contents(record.value))
            if decoded["command_id"] == command_id:
                found.append((Outcome.from_record(decoded), credential.seals(record.value)))
        assert len(found) == 1, found
        return found[0]

    def admin_sends(self, kind: str, body: dict[str, Any]) -> Outcome:
        outcome, sealed = self.send(self.admin, ADMIN_DOMAIN, kind, body, self.fresh_id())
        assert sealed, outcome
        return outcome

    def principal_sends(self, name: str, domain: str, kind: str, body: dict[str, Any], command_id: str) -> Outcome:
        """Send as `name`, checking what holds of any command: a principal the model has disabled is
        refused unsealed; an enabled one gets its outcome sealed. A PermissionDenied (here always the
        authentication's or the table row's) leaves the state and the id's stored outcome as they
        were; any other outcome leaves one stored."""
        before = self.embedded.state_digest(domain)
        had = self.embedded.stored_outcome(domain, command_id)
        outcome, sealed = self.send(self.credentials[name], domain, kind, body, command_id)
        enabled = self.model.principals[name].enabled
        assert sealed == enabled, (outcome, enabled)
        if not enabled:
            assert (outcome.status, outcome.error_code) == ("rejected", DENIED), outcome
        if outcome.error_code == DENIED:
            assert self.embedded.stored_outcome(domain, command_id) == had, outcome
            assert self.embedded.state_digest(domain) == before, outcome
        else:
            assert self.embedded.stored_outcome(domain, command_id) is not None
        return outcome

    # -- the policy -----------------------------------------------------------------------------

    def check_view(self, outcome: Outcome, name: str) -> None:
        """A committed PrincipalView of `name` that is the model's, at the model's epoch."""
        assert outcome.status == "committed", outcome
        view = outcome.result
        assert isinstance(view, PrincipalView), view
        expected = self.model.principals[name]
        record = view.principal
        got = {(g.capability.value, g.domain, g.resource) for g in record.grants}
        assert (view.policy_epoch, record.principal, record.enabled, record.revision, got) == (
            self.model.epoch,
            name,
            expected.enabled,
            expected.revision,
            expected.grants,
        ), view
        assert record.key_id == self.credentials[name].key_id

    def check_self_view(self, credential: Credential, domain: str) -> None:
        outcome, sealed = self.send(credential, domain, INSPECT_PRINCIPAL, {"principal": None}, self.fresh_id())
        assert sealed and outcome.status == "committed", outcome
        assert isinstance(outcome.result, PrincipalView) and outcome.result.policy_epoch == self.model.epoch

    @rule(name=principals, grant=grants)
    def admin_grants(self, name: str, grant: GrantKey) -> None:
        principal = self.model.principals[name]
        if grant not in principal.grants:
            principal.grants.add(grant)
            principal.revision += 1
            self.model.epoch += 1
        self.check_view(self.admin_sends(GRANT_CAPABILITY, {"principal": name, "grant": grant_record(grant)}), name)

    @rule(name=principals, held=st.booleans(), pick=st.integers(0, 63), grant=grants)
    def admin_revokes(self, name: str, held: bool, pick: int, grant: GrantKey) -> None:
        """Revoke a grant the principal holds (`held`, when it holds one), else the one drawn."""
        principal = self.model.principals[name]
        if held and principal.grants:
            grant = sorted(principal.grants)[pick % len(principal.grants)]
        if grant in principal.grants:
            principal.grants.remove(grant)
            principal.revision += 1
            self.model.epoch += 1
        self.check_view(self.admin_sends(REVOKE_CAPABILITY, {"principal": name, "grant": grant_record(grant)}), name)

    @rule(
        name=principals,
        enabled=st.sampled_from([True, True, False]),
        stale=st.sampled_from([False, False, False, True]),
    )
    def admin_puts_enabled(self, name: str, enabled: bool, stale: bool) -> None:
        """PutPrincipal enabled=...: a change even when the value stays; under a stale expected
        revision, a RevisionConflict that changes nothing."""
        principal = self.model.principals[name]
        expected = principal.revision - 1 if stale else principal.revision
        body = {"principal": name, "key_id": None, "enabled": enabled, "grants": None, "expected_revision": expected}
        outcome = self.admin_sends(PUT_PRINCIPAL, body)
        if stale:
            assert (outcome.status, outcome.error_code) == ("rejected", "RevisionConflict"), outcome
            return
        principal.enabled = enabled
        principal.revision += 1
        self.model.epoch += 1
        self.check_view(outcome, name)

    @rule()
    def the_administrator_steps_down_and_is_restored(self) -> None:
        """keyload-admin disables itself: a Conflict that changes nothing while no principal of the
        model is enabled with admin on every domain; otherwise it is disabled, and such a principal
        enables it again."""
        successors = [name for name in PRINCIPALS if self.model.allows_everywhere(name, Capability.admin)]
        body = {"principal": ADMIN_PRINCIPAL, "key_id": None, "enabled": False, "grants": None}
        body["expected_revision"] = None
        outcome = self.admin_sends(PUT_PRINCIPAL, body)
        if not successors:
            assert (outcome.status, outcome.error_code) == ("rejected", "Conflict"), outcome
            self.check_self_view(self.admin, ADMIN_DOMAIN)  # still the administrator, at the same epoch
            return
        assert outcome.status == "committed", outcome
        self.model.epoch += 1
        restore = body | {"enabled": True}
        again, sealed = self.send(
            self.credentials[successors[0]], ADMIN_DOMAIN, PUT_PRINCIPAL, restore, self.fresh_id()
        )
        assert sealed and again.status == "committed", again
        self.model.epoch += 1
        self.check_self_view(self.admin, ADMIN_DOMAIN)

    # -- principals at work -------------------------------------------------------------------

    def body_of(self, kind: str, queue: str) -> dict[str, Any]:
        if kind == CREATE_QUEUE:
            return create_queue_body(queue)
        if kind == ENQUEUE:
            return enqueue_body(queue, f"m-{uuid.uuid4().hex[:12]}")
        if kind == INSPECT_QUEUE:
            return {"queue": queue}
        return receive_body(queue, max_messages=1)

    def model_allows(self, name: str, domain: str, kind: str, body: dict[str, Any]) -> bool:
        if kind == BATCH:
            return self.first_denied(name, domain, body) is None
        if kind == INSPECT_PRINCIPAL:
            other = body["principal"] not in (None, name)
            enabled = self.model.principals[name].enabled
            return self.model.allows_everywhere(name, Capability.admin) if other else enabled
        return self.model.allows(name, NEEDS[kind], domain, body["queue"])

    def first_denied(self, name: str, domain: str, body: dict[str, Any]) -> int | None:
        for index, item in enumerate(body["mutations"]):
            kind, mutation_body = item["mutation"]
            assert kind == ENQUEUE
            if not self.model.allows(name, Capability.enqueue, domain, mutation_body["queue"]):
                return index
        return None

    def took_effect(self, domain: str, kind: str, body: dict[str, Any], outcome: Outcome) -> None:
        """Track the queues and their enqueue counts from a committed outcome."""
        if outcome.status != "committed":
            return
        if kind == CREATE_QUEUE:
            self.queues.setdefault((domain, body["queue"]), 0)
        elif kind == ENQUEUE:
            self.queues[(domain, body["queue"])] += 1
        elif kind == BATCH:
            for item in body["mutations"]:
                self.queues[(domain, item["mutation"][1]["queue"])] += 1

    def check_first_outcome(self, name: str, domain: str, kind: str, body: dict[str, Any], outcome: Outcome) -> None:
        """A command applied for the first time: PermissionDenied exactly when the model refuses it
        (any other outcome, a domain refusal too, counts as allowed)."""
        allowed = self.model_allows(name, domain, kind, body)
        event(f"{kind.rsplit('.', 1)[1]}: {'allowed' if allowed else 'denied'}, {outcome.status}")
        assert (outcome.error_code == DENIED) == (not allowed), (allowed, outcome)
        if kind == BATCH and not allowed and self.model.principals[name].enabled:
            assert outcome.failed_index == self.first_denied(name, domain, body), outcome
        if kind == BATCH and allowed:
            assert outcome.status == "committed" and isinstance(outcome.result, BatchResult), outcome
        self.took_effect(domain, kind, body, outcome)

    def check_handled(self, domain: str, kind: str, outcome: Outcome, existed: bool) -> None:
        """What the handler of a single command answers once authorization let it run: CreateQueue of
        a queue that `existed` a Conflict, a command on a queue that did not NotFound, InspectPrincipal
        its view (any grant it needs was checked by its row)."""
        if outcome.error_code == DENIED or kind == BATCH:
            return
        if kind == INSPECT_PRINCIPAL:
            expected = None
        elif kind == CREATE_QUEUE:
            expected = None if not existed else "Conflict"
        else:
            expected = None if existed else "NotFound"
        assert outcome.error_code == expected, outcome

    def remember(
        self, name: str, domain: str, kind: str, body: dict[str, Any], command_id: str, outcome: Outcome
    ) -> None:
        """A first send: its id holds a stored outcome exactly when the send passed authorization."""
        stored = None if outcome.error_code == DENIED else outcome
        self.sent.append(Sent(name, domain, kind, body, command_id, stored))

    def aimed(
        self, name: str, pick: int, usable: tuple[Capability, ...], domain: str | None = None
    ) -> tuple[str, str, str] | None:
        """(capability, domain, queue) within one of `name`'s grants of a `usable` capability (the
        model's pick) in `domain` (None: any), so that commands the model allows are common; None
        when it holds none."""
        candidates = DOMAINS if domain is None else (domain,)
        held = sorted(
            (capability, d, r)
            for capability, d, r in self.model.principals[name].grants
            if Capability(capability) in usable
            and any(covers(d, domain) for domain in candidates)
            and any(covers(r, queue) for queue in QUEUES)
        )
        if not held:
            return None
        capability, domain_pattern, resource_pattern = held[pick % len(held)]
        chosen = next(d for d in candidates[pick % len(candidates) :] + candidates if covers(domain_pattern, d))
        queue = next(q for q in QUEUES[pick % 3 :] + QUEUES if covers(resource_pattern, q))
        return capability, chosen, queue

    @rule(
        name=principals,
        domain=domains,
        kind=st.sampled_from([CREATE_QUEUE, ENQUEUE, ENQUEUE, INSPECT_QUEUE, RECEIVE]),
        queue=queues,
        aim=st.booleans(),
        pick=st.integers(0, 63),
    )
    def principal_sends_a_command(self, name: str, domain: str, kind: str, queue: str, aim: bool, pick: int) -> None:
        """A command on a random queue, or (`aim`) on one a grant of the principal names."""
        target = self.aimed(name, pick, (*NEEDS.values(), Capability.admin)) if aim else None
        if target is not None:
            capability, domain, queue = target
            if capability != Capability.admin:
                kind = next(k for k, needed in NEEDS.items() if needed == capability)
        body = self.body_of(kind, queue)
        command_id = self.fresh_id()
        existed = (domain, queue) in self.queues
        outcome = self.principal_sends(name, domain, kind, body, command_id)
        self.check_first_outcome(name, domain, kind, body, outcome)
        self.check_handled(domain, kind, outcome, existed)
        self.remember(name, domain, kind, body, command_id, outcome)

    @rule(domain=domains, queue=queues)
    def admin_creates_a_queue(self, domain: str, queue: str) -> None:
        outcome, sealed = self.send(self.admin, domain, CREATE_QUEUE, create_queue_body(queue), self.fresh_id())
        assert sealed and outcome.error_code == (None if (domain, queue) not in self.queues else "Conflict"), outcome
        self.took_effect(domain, CREATE_QUEUE, create_queue_body(queue), outcome)

    @rule(name=principals, other=st.sampled_from((None, *PRINCIPALS)))
    def principal_inspects_a_principal(self, name: str, other: str | None) -> None:
        """Itself (no capability needed) or another (admin on every domain)."""
        body = {"principal": other}
        command_id = self.fresh_id()
        outcome = self.principal_sends(name, ADMIN_DOMAIN, INSPECT_PRINCIPAL, body, command_id)
        self.check_first_outcome(name, ADMIN_DOMAIN, INSPECT_PRINCIPAL, body, outcome)
        if outcome.status == "committed":
            self.check_view(outcome, name if other is None else other)
        self.remember(name, ADMIN_DOMAIN, INSPECT_PRINCIPAL, body, command_id, outcome)

    @rule(
        name=principals,
        domain=domains,
        into=st.lists(queues, min_size=2, max_size=3),
        aim=st.booleans(),
        pick=st.integers(0, 63),
    )
    def principal_sends_a_batch(self, name: str, domain: str, into: list[str], aim: bool, pick: int) -> None:
        """2..3 Enqueues into queues that exist (the administrator creates the first queue drawn when
        the domain has none), so that no domain refusal comes before a PermissionDenied; with
        `aim`, in a domain and first into a queue one of the principal's enqueue grants names."""
        target = self.aimed(name, pick, (Capability.enqueue, Capability.admin)) if aim else None
        if target is not None:
            _, domain, queue = target
            into = [queue, *into[1:]]
        existing = [queue for queue in QUEUES if (domain, queue) in self.queues]
        if not existing:
            self.admin_creates_a_queue(domain, into[0])
            existing = [into[0]]
        targets = [queue if queue in existing else existing[i % len(existing)] for i, queue in enumerate(into)]
        body = batch_body(*(mutation(ENQUEUE, enqueue_body(q, f"m-{uuid.uuid4().hex[:12]}")) for q in targets))
        totals = {queue: self.inspect(domain, queue) for queue in existing}
        command_id = self.fresh_id()
        outcome = self.principal_sends(name, domain, BATCH, body, command_id)
        self.check_first_outcome(name, domain, BATCH, body, outcome)
        if outcome.status != "committed":
            assert {queue: self.inspect(domain, queue) for queue in existing} == totals
        self.remember(name, domain, BATCH, body, command_id, outcome)

    def admin_sends_in(self, domain: str, kind: str, body: dict[str, Any]) -> Outcome:
        outcome, sealed = self.send(self.admin, domain, kind, body, self.fresh_id())
        assert sealed and outcome.status == "committed", outcome
        return outcome

    def inspect(self, domain: str, queue: str) -> int:
        """The queue's enqueued_total, as the administrator's InspectQueue reads it."""
        view = self.admin_sends_in(domain, INSPECT_QUEUE, {"queue": queue}).result
        assert isinstance(view, QueueView)
        return view.counters.enqueued_total

    def existed(self, domain: str, body: dict[str, Any]) -> bool:
        return "queue" in body and (domain, body["queue"]) in self.queues

    @precondition(lambda self: bool(self.sent))
    @rule(pick=st.integers(0, 1_000))
    def principal_repeats_a_command(self, pick: int) -> None:
        """The same command id and command again, by the same principal."""
        sent = self.sent[pick % len(self.sent)]
        name, domain, kind, body = sent.principal, sent.domain, sent.kind, sent.body
        allowed = self.model_allows(name, domain, kind, body)
        existed = self.existed(domain, body)
        outcome = self.principal_sends(name, domain, kind, body, sent.command_id)
        event(f"repeat: {'unstored' if sent.stored is None else 'stored'}, {'allowed' if allowed else 'denied'}")
        if sent.stored is None:  # every send under the id was refused: this one is a first send
            self.check_first_outcome(name, domain, kind, body, outcome)
            self.check_handled(domain, kind, outcome, existed)
            if outcome.error_code != DENIED:
                sent.stored = outcome
            return
        first = sent.stored
        answered = (outcome.offset, outcome.status, outcome.error_code, outcome.failed_index, outcome.result)
        stored = (first.offset, first.status, first.error_code, first.failed_index, first.result)
        if not allowed:
            assert (outcome.status, outcome.error_code) == ("rejected", DENIED), (first, outcome)
            assert outcome.offset != first.offset, outcome
            return
        assert answered == stored, (first, outcome)

    @precondition(lambda self: any(sent.stored is None for sent in self.sent))
    @rule(pick=st.integers(0, 1_000))
    def admin_grants_what_a_refused_command_needs_and_it_is_sent_again(self, pick: int) -> None:
        """A command id no send took yet: the administrator grants its principal what the command
        lacked (exactly its queue, or admin on every domain), and the very command is sent again."""
        unstored = [index for index, sent in enumerate(self.sent) if sent.stored is None]
        index = unstored[pick % len(unstored)]
        sent = self.sent[index]
        if sent.kind == INSPECT_PRINCIPAL:
            grant: GrantKey = (Capability.admin.value, "*", "*")
        elif sent.kind == BATCH:
            at = self.first_denied(sent.principal, sent.domain, sent.body) or 0
            grant = (Capability.enqueue.value, sent.domain, sent.body["mutations"][at]["mutation"][1]["queue"])
        else:
            grant = (NEEDS[sent.kind].value, sent.domain, sent.body["queue"])
        self.admin_grants(sent.principal, grant)
        self.principal_repeats_a_command(index)

    @precondition(lambda self: bool(self.sent))
    @rule(
        pick=st.integers(0, 1_000),
        name=principals,
        kind=st.sampled_from([CREATE_QUEUE, ENQUEUE, INSPECT_QUEUE, RECEIVE, INSPECT_PRINCIPAL]),
        queue=queues,
        other=st.sampled_from((None, *PRINCIPALS)),
        aim=st.booleans(),
        aim_pick=st.integers(0, 63),
    )
    def principal_reuses_a_command_id(
        self, pick: int, name: str, kind: str, queue: str, other: str | None, aim: bool, aim_pick: int
    ) -> None:
        """A different command (another principal's, or another body) under a command id already
        sent in the domain: authorized first, as the command it is; allowed, a Conflict when the id
        holds a stored outcome, else applied as a first send (the id is the new command's now)."""
        index = pick % len(self.sent)
        sent = self.sent[index]
        domain = sent.domain
        if kind == INSPECT_PRINCIPAL:
            body: dict[str, Any] = {"principal": other}
        else:
            target = self.aimed(name, aim_pick, (*NEEDS.values(), Capability.admin), domain) if aim else None
            if target is not None:
                capability, _, queue = target
                if capability != Capability.admin:
                    kind = next(k for k, needed in NEEDS.items() if needed == capability)
            body = self.body_of(kind, queue)
        if (name, kind, body) == (sent.principal, sent.kind, sent.body):
            return  # the same command: a repeat, which the rule above sends
        allowed = self.model_allows(name, domain, kind, body)
        existed = self.existed(domain, body)
        stored = self.embedded.stored_outcome(domain, sent.command_id)
        assert (stored is None) == (sent.stored is None), sent
        outcome = self.principal_sends(name, domain, kind, body, sent.command_id)
        event(f"reuse: {'unstored' if sent.stored is None else 'stored'}, {'allowed' if allowed else 'denied'}")
        if sent.stored is None:
            self.check_first_outcome(name, domain, kind, body, outcome)
            self.check_handled(domain, kind, outcome, existed)
            if kind == INSPECT_PRINCIPAL and outcome.status == "committed":
                self.check_view(outcome, name if other is None else other)
            if outcome.error_code != DENIED:
                self.sent[index] = Sent(name, domain, kind, body, sent.command_id, outcome)
            return
        if not allowed:
            assert (outcome.status, outcome.error_code) == ("rejected", DENIED), (sent, outcome)
        else:
            assert (outcome.status, outcome.error_code) == ("rejected", "Conflict"), (sent, outcome)
            assert outcome.detail == "command id was used for a different command", outcome
        assert outcome.offset != sent.stored.offset, outcome
        assert self.embedded.stored_outcome(domain, sent.command_id) == stored

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def queues_match_the_model(self) -> None:
        for domain in DOMAINS:
            for queue in QUEUES:
                raw = self.embedded.store(domain).get(keys.queue(domain, queue))
                expected = self.queues.get((domain, queue))
                if expected is None:
                    assert raw is None, (domain, queue)
                else:
                    assert raw is not None, (domain, queue)
                    counters = REGISTRY.decode("keyload.QueueRecord", raw)["view"]["counters"]
                    assert counters["enqueued_total"] == expected, (domain, queue)

    def teardown(self) -> None:
        close_after_replay_check(self.embedded, self.directory)


AccessMachine.TestCase.settings = settings(max_examples=50, stateful_step_count=50, deadline=None, derandomize=True)
test_access_model = AccessMachine.TestCase


# -- repeats after a revoke: the machine's first finding, pinned ---------------------------------


def started() -> AccessMachine:
    """A machine outside Hypothesis: the principals without grants, queue q1 in "shop"."""
    machine = AccessMachine()
    machine.admin_creates_the_principals([[], [], []])
    machine.admin_creates_a_queue("shop", "q1")
    return machine


def sent_revoked_repeated(
    machine: AccessMachine, grant: GrantKey, kind: str, body: dict[str, Any]
) -> tuple[Outcome, Outcome]:
    """The first and the second outcome of one command id that principal ann sends under `grant`,
    then again once the grant is revoked."""
    machine.admin_grants("ann", grant)
    first, _ = machine.send(machine.credentials["ann"], "shop", kind, body, "repeated")
    assert first.status == "committed", first
    machine.admin_revokes("ann", False, 0, grant)
    again, _ = machine.send(machine.credentials["ann"], "shop", kind, body, "repeated")
    return first, again


def test_a_repeated_enqueue_is_refused_once_its_grant_is_revoked() -> None:
    machine = started()
    try:
        first, again = sent_revoked_repeated(machine, ("enqueue", "shop", "q1"), ENQUEUE, enqueue_body("q1", "m1"))
        assert (again.status, again.error_code) == ("rejected", DENIED) and again.offset != first.offset, again
    finally:
        machine.teardown()


def test_a_repeated_batch_is_refused_once_its_grant_is_revoked() -> None:
    """Each mutation is authorized as the command it is, and a repeat by the policy of now."""
    machine = started()
    try:
        body = batch_body(mutation(ENQUEUE, enqueue_body("q1", "m1")))
        first, again = sent_revoked_repeated(machine, ("enqueue", "shop", "q1"), BATCH, body)
        assert (again.status, again.error_code) == ("rejected", DENIED) and again.offset != first.offset, again
    finally:
        machine.teardown()


def test_a_repeated_inspection_of_another_principal_is_refused_once_admin_is_revoked() -> None:
    machine = started()
    try:
        first, again = sent_revoked_repeated(machine, ("admin", "*", "*"), INSPECT_PRINCIPAL, {"principal": "bob"})
        assert (again.status, again.error_code) == ("rejected", DENIED) and again.offset != first.offset, again
    finally:
        machine.teardown()


# -- command ids and authorization refusals, pinned ------------------------------------------------


def test_a_command_id_refused_by_authorization_applies_fresh_once_allowed() -> None:
    """ann without enqueue: her Enqueue is refused and stores nothing; granted, the very command under
    the same id applies at its new offset, and only then is the id's outcome stored and repeated."""
    machine = started()
    try:
        ann = machine.credentials["ann"]
        body = enqueue_body("q1", "m1")
        refused, sealed = machine.send(ann, "shop", ENQUEUE, body, "first")
        assert (refused.status, refused.error_code, sealed) == ("rejected", DENIED, True), refused
        assert machine.embedded.stored_outcome("shop", "first") is None
        machine.admin_grants("ann", ("enqueue", "shop", "q1"))
        applied, _ = machine.send(ann, "shop", ENQUEUE, body, "first")
        assert applied.status == "committed" and applied.offset > refused.offset, applied
        assert machine.embedded.stored_outcome("shop", "first") is not None
        machine.queues[("shop", "q1")] += 1
        again, _ = machine.send(ann, "shop", ENQUEUE, body, "first")
        assert again == applied
    finally:
        machine.teardown()


def test_a_stored_command_id_is_authorized_before_it_is_compared() -> None:
    """ann's InspectQueue is stored under "used"; bob, without inspect, sending the same body under it
    (another principal: another command) is PermissionDenied, not Conflict; granted inspect, Conflict."""
    machine = started()
    try:
        machine.admin_grants("ann", ("inspect", "shop", "q1"))
        first, _ = machine.send(machine.credentials["ann"], "shop", INSPECT_QUEUE, {"queue": "q1"}, "used")
        assert first.status == "committed", first
        stored = machine.embedded.stored_outcome("shop", "used")
        bob = machine.credentials["bob"]
        denied, sealed = machine.send(bob, "shop", INSPECT_QUEUE, {"queue": "q1"}, "used")
        assert (denied.status, denied.error_code, sealed) == ("rejected", DENIED, True), denied
        machine.admin_grants("bob", ("inspect", "shop", "q*"))
        conflict, _ = machine.send(bob, "shop", INSPECT_QUEUE, {"queue": "q1"}, "used")
        assert (conflict.status, conflict.error_code) == ("rejected", "Conflict"), conflict
        assert machine.embedded.stored_outcome("shop", "used") == stored
    finally:
        machine.teardown()
