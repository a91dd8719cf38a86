"""Black-box scenarios of access control (docs/ARCHITECTURE.md §5a, README "Using it"), against one real
`keyload run`: what a user of the SDK and the CLI notices of principals, grants, disabling, credential
rotation, repeats of command ids after a revocation and the last-administrator rule.

Every test uses domains and principal names of its own (prefixed with its number), so they share one
service without interfering. Test 6 disables and re-enables the administrator; it restores it whatever
happens, so the tests after it still act as `keyload-admin`.
"""

from __future__ import annotations

import base64
import json
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from keyload import Capability, Client, Credential, ErrorCode, Grant, OutcomeTimeout
from keyload.errors import ConflictError, PermissionDeniedError

from .support import run_keyload, start_service, stop_service

ADMIN = "keyload-admin"
# How long a client waits for an outcome that, by the docs, never comes sealed with its key (a disabled
# principal's or a stale credential's command): the refusal is published unsealed and passed over.
UNAUTHENTICATED_WAIT_S = 5.0  # ample for one command's refusal to arrive on a loaded machine
SAME_DETAIL = "no enabled principal of this name signs with this key id"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The data directory of one `keyload run`, created by it, shared by this module's tests."""
    root = tmp_path_factory.mktemp("access-scenarios") / "data"
    process = start_service(root)
    try:
        yield root
    finally:
        assert stop_service(process) == 0


def can(capability: Capability, domain: str, resource: str = "*") -> Grant:
    return Grant(capability=capability, domain=domain, resource=resource)


def secrets_of(credential: Credential) -> list[str]:
    """The forms a credential's secret could take in a message."""
    return [base64.b64encode(credential.secret).decode("ascii"), credential.secret.hex()]


def assert_unauthenticated_timeout(refused: pytest.ExceptionInfo[OutcomeTimeout]) -> None:
    """The docs' "a client with a wrong credential times out with that note": the refusal came, unsealed."""
    message = str(refused.value)
    assert "were not sealed with this client's key" in message, message
    assert ErrorCode.PERMISSION_DENIED in message, message
    assert SAME_DETAIL in message, message


def cli_json(*args: str) -> Any:
    """Run a keyload CLI command that must succeed; its JSON output."""
    done = run_keyload(*args, "--json")
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    return json.loads(done.stdout)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# -- 1. a grant on one queue of one domain ---------------------------------------------------------------------


def test_a_principal_enqueues_only_where_it_is_granted(served: Path) -> None:
    with Client(served) as admin:
        admin.create_queue("s1-shop", "jobs")
        admin.create_queue("s1-shop", "other")
        admin.create_queue("s1-elsewhere", "jobs")
        credential = admin.create_principal("s1-producer", [can(Capability.enqueue, "s1-shop", "jobs")])
        admin_credential = admin.credential
    with Client(served, principal="s1-producer") as producer:
        receipt = producer.enqueue("s1-shop", "jobs", b"hello", message_id="m1")
        assert (receipt.queue, receipt.message_id, receipt.state) == ("jobs", "m1", "ready")
        for domain, queue in (("s1-shop", "other"), ("s1-elsewhere", "jobs")):
            with pytest.raises(PermissionDeniedError) as refused:
                producer.enqueue(domain, queue, b"nope", message_id="m2")
            outcome = refused.value.outcome
            assert (outcome.status, outcome.error_code) == ("rejected", ErrorCode.PERMISSION_DENIED)
            detail = outcome.detail or ""
            assert "enqueue" in detail, detail
            for text in (detail, str(refused.value)):
                for secret in secrets_of(credential) + secrets_of(admin_credential):
                    assert secret not in text
    with Client(served) as admin:
        assert admin.inspect_queue("s1-shop", "jobs").counters.enqueued_total == 1
        assert admin.inspect_queue("s1-shop", "other").counters.enqueued_total == 0
        assert admin.inspect_queue("s1-elsewhere", "jobs").counters.enqueued_total == 0


# -- 2. grant and revoke apply from their log position --------------------------------------------------------


def test_inspect_is_allowed_only_while_granted(served: Path) -> None:
    inspect = can(Capability.inspect, "s2-shop", "jobs")
    with Client(served) as admin:
        admin.create_queue("s2-shop", "jobs")
        admin.create_principal("s2-consumer", [can(Capability.consume, "s2-shop", "jobs")])
    with Client(served, principal="s2-consumer") as consumer, Client(served) as admin:
        assert consumer.receive("s2-shop", "jobs").deliveries == []  # consume is granted
        with pytest.raises(PermissionDeniedError) as refused:
            consumer.inspect_queue("s2-shop", "jobs")
        assert "inspect" in (refused.value.outcome.detail or "")

        before = consumer.whoami()
        granted = admin.grant("s2-consumer", inspect)
        assert inspect in granted.principal.grants
        assert granted.principal.revision == before.principal.revision + 1
        assert granted.policy_epoch > before.policy_epoch
        assert consumer.inspect_queue("s2-shop", "jobs").queue == "jobs"

        revoked = admin.revoke("s2-consumer", inspect)
        assert inspect not in revoked.principal.grants
        assert revoked.principal.revision == granted.principal.revision + 1
        with pytest.raises(PermissionDeniedError) as again:
            consumer.inspect_queue("s2-shop", "jobs")
        assert "inspect" in (again.value.outcome.detail or "")
        assert consumer.receive("s2-shop", "jobs").deliveries == []  # consume stays


# -- 3. disabling a principal -----------------------------------------------------------------------------------


def test_a_disabled_principal_is_refused_until_enabled_again(served: Path) -> None:
    with Client(served) as admin:
        admin.create_queue("s3-shop", "jobs")
        admin.create_principal("s3-worker", [can(Capability.enqueue, "s3-shop")])
    with Client(served, principal="s3-worker", timeout_s=UNAUTHENTICATED_WAIT_S) as worker:
        worker.enqueue("s3-shop", "jobs", b"before", message_id="before")

        disabled = run_keyload("principal", "disable", "s3-worker", "--data", str(served))
        assert disabled.returncode == 0, disabled.stderr
        with Client(served) as admin:
            assert admin.inspect_principal("s3-worker").principal.enabled is False

        with pytest.raises(OutcomeTimeout) as refused:
            worker.enqueue("s3-shop", "jobs", b"while", message_id="while")
        assert_unauthenticated_timeout(refused)
        with pytest.raises(OutcomeTimeout) as unknown:
            worker.whoami()
        assert_unauthenticated_timeout(unknown)
        whoami = run_keyload(
            "whoami", "--data", str(served), "--as", "s3-worker", "--timeout", str(UNAUTHENTICATED_WAIT_S)
        )
        assert whoami.returncode == 1, (whoami.stdout, whoami.stderr)
        assert whoami.stderr.startswith("keyload: "), whoami.stderr
        assert ErrorCode.PERMISSION_DENIED in whoami.stderr, whoami.stderr

        enabled = run_keyload("principal", "enable", "s3-worker", "--data", str(served))
        assert enabled.returncode == 0, enabled.stderr
        assert worker.whoami().principal.enabled is True
        worker.enqueue("s3-shop", "jobs", b"after", message_id="after")
    with Client(served) as admin:
        assert admin.inspect_queue("s3-shop", "jobs").counters.enqueued_total == 2  # "while" was never applied
    me = cli_json("whoami", "--data", str(served), "--as", "s3-worker")
    assert me["principal"]["principal"] == "s3-worker" and me["principal"]["enabled"] is True


# -- 4. credential rotation -------------------------------------------------------------------------------------


def test_rotate_credential_refuses_the_old_key_and_accepts_the_new(served: Path) -> None:
    with Client(served) as admin:
        admin.create_queue("s4-shop", "jobs")
        first = admin.create_principal("s4-rotor", [can(Capability.enqueue, "s4-shop")])
    with Client(served, principal="s4-rotor", timeout_s=UNAUTHENTICATED_WAIT_S) as old:
        old.enqueue("s4-shop", "jobs", b"old", message_id="old-1")
        with Client(served) as admin:
            rotated = admin.rotate_credential("s4-rotor")
        assert rotated.key_id != first.key_id and rotated.principal == "s4-rotor"
        assert Credential.load(served / "credentials" / "s4-rotor.json") == rotated
        with pytest.raises(OutcomeTimeout) as refused:
            old.enqueue("s4-shop", "jobs", b"old", message_id="old-2")
        assert_unauthenticated_timeout(refused)
    with Client(served, principal="s4-rotor") as new:
        assert new.whoami().principal.key_id == rotated.key_id
        new.enqueue("s4-shop", "jobs", b"new", message_id="new-1")
    with Client(served) as admin:
        assert admin.inspect_queue("s4-shop", "jobs").counters.enqueued_total == 2


def test_cli_rotate_makes_the_old_credential_file_useless(served: Path, tmp_path: Path) -> None:
    data = str(served)
    created = run_keyload("principal", "create", "s4-cli", "--data", data, "--grant", "inspect:s4-cli-shop")
    assert created.returncode == 0, created.stderr
    path = served / "credentials" / "s4-cli.json"
    saved = tmp_path / "old-s4-cli.json"
    saved.write_bytes(path.read_bytes())
    saved.chmod(0o600)
    old = Credential.load(saved)
    assert cli_json("whoami", "--data", data, "--credential", str(saved))["principal"]["key_id"] == old.key_id

    rotated = run_keyload("principal", "rotate", "s4-cli", "--data", data)
    assert rotated.returncode == 0, rotated.stderr
    new = Credential.load(path)
    assert new.key_id != old.key_id

    stale = run_keyload("whoami", "--data", data, "--credential", str(saved), "--timeout", str(UNAUTHENTICATED_WAIT_S))
    assert stale.returncode == 1, (stale.stdout, stale.stderr)
    assert ErrorCode.PERMISSION_DENIED in stale.stderr, stale.stderr
    assert cli_json("whoami", "--data", data, "--as", "s4-cli")["principal"]["key_id"] == new.key_id
    inspected = cli_json("principal", "inspect", "s4-cli", "--data", data)
    assert inspected["principal"]["key_id"] == new.key_id


# -- 5. a repeat of a stored command id is re-authorized ---------------------------------------------------------


def test_a_repeated_command_id_is_refused_after_its_grant_is_revoked(served: Path) -> None:
    enqueue = can(Capability.enqueue, "s5-shop", "orders")
    with Client(served) as admin:
        admin.create_queue("s5-shop", "orders")
        admin.create_principal("s5-producer", [enqueue])
    with Client(served, principal="s5-producer") as producer, Client(served) as admin:
        receipt = producer.enqueue("s5-shop", "orders", b"order", command_id="s5-order-1")
        assert producer.enqueue("s5-shop", "orders", b"order", command_id="s5-order-1") == receipt  # stored

        admin.revoke("s5-producer", enqueue)
        with pytest.raises(PermissionDeniedError) as refused:
            producer.enqueue("s5-shop", "orders", b"order", command_id="s5-order-1")
        assert refused.value.outcome.error_code == ErrorCode.PERMISSION_DENIED
        assert "enqueue" in (refused.value.outcome.detail or "")

        admin.grant("s5-producer", enqueue)  # allowed again: the stored outcome as before
        assert producer.enqueue("s5-shop", "orders", b"order", command_id="s5-order-1") == receipt
        assert admin.inspect_queue("s5-shop", "orders").counters.enqueued_total == 1


# -- 6. the last administrator -----------------------------------------------------------------------------------


def test_the_last_administrator_cannot_be_disabled_until_there_is_another(served: Path) -> None:
    with Client(served) as admin:
        with pytest.raises(ConflictError) as refused:
            admin.put_principal(ADMIN, enabled=False)
        assert refused.value.outcome.error_code == ErrorCode.CONFLICT
        with pytest.raises(ConflictError):
            admin.revoke(ADMIN, can(Capability.admin, "*"))
        me = admin.whoami().principal
        assert me.enabled and can(Capability.admin, "*") in me.grants

        admin.create_principal("s6-admin", [can(Capability.admin, "*")])
        with Client(served, principal="s6-admin") as second:
            try:
                assert admin.put_principal(ADMIN, enabled=False).principal.enabled is False
                assert second.inspect_principal(ADMIN).principal.enabled is False
                # The new administrator administers: resources, principals, and the rule protects it now.
                second.create_queue("s6-shop", "jobs")
                second.create_principal("s6-user", [can(Capability.enqueue, "s6-shop")])
                assert second.inspect_principal("s6-user").principal.grants == [can(Capability.enqueue, "s6-shop")]
                with pytest.raises(ConflictError):
                    second.put_principal("s6-admin", enabled=False)
            finally:
                second.put_principal(ADMIN, enabled=True)
    with Client(served) as admin:
        assert admin.whoami().principal.enabled is True


# -- 7. the command line and the files it writes -----------------------------------------------------------------


def test_cli_principal_create_and_whoami_and_the_files_modes(served: Path) -> None:
    data = str(served)
    me = cli_json("whoami", "--data", data)
    assert me["principal"]["principal"] == ADMIN
    text = run_keyload("whoami", "--data", data, "--output", "text")
    assert text.returncode == 0 and ADMIN in text.stdout, (text.stdout, text.stderr)

    created = run_keyload(
        "principal",
        "create",
        "s7-cli",
        "--data",
        data,
        "--grant",
        "enqueue:s7-shop:jobs",
        "--grant",
        "consume:s7-shop",
    )
    assert created.returncode == 0, created.stderr
    path = served / "credentials" / "s7-cli.json"
    assert mode(path) == 0o600
    written = json.loads(path.read_text())
    assert (written["format"], written["principal"]) == (1, "s7-cli")
    assert written["key_id"].startswith("p-") and written["secret"]
    assert written["secret"] not in created.stdout + created.stderr

    named = cli_json("whoami", "--data", data, "--as", "s7-cli")
    assert named["principal"]["principal"] == "s7-cli"
    assert named["principal"]["key_id"] == written["key_id"]
    grants = {(g["capability"], g["domain"], g["resource"]) for g in named["principal"]["grants"]}
    assert grants == {("enqueue", "s7-shop", "jobs"), ("consume", "s7-shop", "*")}

    again = run_keyload("principal", "create", "s7-cli", "--data", data, "--grant", "admin:*")
    assert again.returncode == 1, (again.stdout, again.stderr)
    assert ErrorCode.REVISION_CONFLICT in again.stderr, again.stderr
    assert json.loads(path.read_text()) == written

    denied = run_keyload("principal", "inspect", ADMIN, "--data", data, "--as", "s7-cli")
    assert denied.returncode == 1 and ErrorCode.PERMISSION_DENIED in denied.stderr, denied.stderr
    assert denied.stderr.startswith("keyload: ") and written["secret"] not in denied.stderr

    assert mode(served) == 0o700
    assert mode(served / "keyring.json") == 0o600
    assert mode(served / "credentials") == 0o700
    assert mode(served / "credentials" / f"{ADMIN}.json") == 0o600
