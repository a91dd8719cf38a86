"""The local transport: a client that appends its signed commands to the log itself and tails its
reply partition of the outcome stream for the answers (a local operator's tools, same machine and
clock on the embedded log; any producer on Kafka)."""

from __future__ import annotations

import os
import time
from typing import Any

from keyload.commands import BY_BRANCH
from keyload.credentials import Credential, contents
from keyload.errors import InvalidCommand, OutcomeTimeout, UnreadableOutcome
from keyload.log.base import LogCorruption, LogTruncated, partition_for
from keyload.log.codec import REGISTRY, UnknownSchema
from keyload.sdk.envelope import encode_command, long_poll_s, unsealed_note
from keyload.sdk.results import Outcome
from keyload.service.doorbell import Doorbell
from keyload.storage.datadir import DataDir

OUTCOME_POLL_MIN_S = 0.0005  # first wait for an outcome; doubles while none comes
OUTCOME_POLL_MAX_S = 0.010
OUTCOME_READ_BATCH = 256


class LogTransport:
    """Appends to the data directory's command log and waits on one reply partition."""

    def __init__(self, data: DataDir, credential: Credential, reply_partition: int | None = None) -> None:
        self.data = data
        self.credential = credential
        self._closed = False
        self.commands = data.command_log()
        self._outcomes = data.outcome_log()
        # Kafka processors block in their fetch and wake on new records; only the
        # embedded service listens for a doorbell.
        self._doorbell = Doorbell(data.root) if data.kafka is None else None
        self._cursor: int | None = None  # the next outcome to read of the reply partition
        partitions = data.outcome_partitions
        self._reply_chosen = reply_partition is not None  # else picked at random: another may serve instead
        self.reply_partition = (
            int.from_bytes(os.urandom(2), "big") % partitions if reply_partition is None else reply_partition
        )
        if not 0 <= self.reply_partition < partitions:
            self.close()
            raise InvalidCommand(f"reply_partition must be 0..{partitions - 1}")

    @property
    def partitions(self) -> int:
        return self.data.partitions

    def close(self) -> None:
        self._closed = True
        self.commands.close()
        self._outcomes.close()
        if self._doorbell is not None:
            self._doorbell.close()

    def submit(self, domain: str, kind: str, body: dict[str, Any], command_id: str, timeout_s: float) -> Outcome:
        if self._closed:
            raise InvalidCommand("the client is closed; nothing was sent")  # as a client of a server says
        self._refuse_missing_key(kind, body)
        if self._cursor is None:
            self._cursor = self._reply_end()  # first: the partition it settles on is the one the command names
        envelope = {
            "command_id": command_id,
            "domain": domain,
            "principal": self.credential.principal,
            "body": (kind, body),
            "reply_to": self.reply_partition,
            "client_time_ms": time.time_ns() // 1_000_000,
        }
        value = self.credential.sign(encode_command(envelope))
        partition = partition_for(domain, self.data.partitions)
        self.commands.append(partition, [value])
        if self._doorbell is not None:
            self._doorbell.ring((partition,))
        return self._await(command_id, domain, timeout_s + long_poll_s(body))

    def _reply_end(self) -> int:
        """Where the wait for the first outcome starts: the reply partition's end. A damaged reply
        partition (a torn frame of the outcome stream, which is never fsynced: §7b) is passed over
        for the next one that reads when the partition was picked at random; one the caller named
        is refused before anything is appended."""
        partitions = self.data.outcome_partitions
        tried = 1 if self._reply_chosen else partitions
        for step in range(tried):
            candidate = (self.reply_partition + step) % partitions
            try:
                end = self._outcomes.end_offset(candidate)
            except LogCorruption as exc:
                damage = exc
                continue
            self.reply_partition = candidate
            return end
        raise self._damaged(damage, "nothing was appended")

    def _damaged(self, damage: LogCorruption, then: str) -> LogCorruption:
        """The error of a reply partition that cannot be read, named as the outcome stream's (not the
        command log's partition of that number), with what was sent and the repair."""
        if self.data.kafka is None:
            where = f"outcome stream partition {self.reply_partition} ({self.data.root / 'log' / 'outcomes'}"
            where += f"/p-{self.reply_partition:04d}, derived data)"
            repair = "stop `keyload run` and delete that folder, which the service writes afresh"
        else:
            where, repair = f"partition {self.reply_partition} of the outcomes topic", "repair the topic"
        return LogCorruption(
            f"{where} cannot be read: {damage}; {then}; to repair it, {repair}, or send through another reply "
            "partition (Client(..., reply_partition=N))",
            damage.offset,
        )

    def refuse_signing_key(self, key_id: str | None) -> None:
        """InvalidCommand for a principal key some partition signs tokens, jitter or proofs with (its
        keys may differ: RotateKeys can name one partition), read from the projections here: that
        partition would refuse the principal after the ones before it applied it. A projection this
        directory does not hold or cannot read now is left to its processor."""
        if key_id is None:
            return
        from keyload.processors.principals import SERVICE_KEY_RULE, signs_for_the_partition  # lazily: processor code
        from keyload.projections.store import Store, StoreError

        for partition in range(self.data.partitions):
            try:
                projection = Store(self.data.projection(partition), read_only=True)
            except StoreError:
                continue
            try:
                signing = signs_for_the_partition(projection, key_id)
            finally:
                projection.close()
            if signing:
                raise InvalidCommand(
                    f"key_id: {SERVICE_KEY_RULE} (partition {partition}): rotate that partition's keys off it "
                    "(keyload keys rotate) or name another key; nothing was appended"
                )

    def _refuse_missing_key(self, kind: str, body: dict[str, Any]) -> None:
        """InvalidCommand for a command naming a key this data directory's keyring lacks
        (CommandKind.keyring_fields), which would halt every partition it reaches until the key is
        added. A client that may not read the keyring (a service's, §5a) leaves it to the processor."""
        row = BY_BRANCH.get(kind)
        if row is None or not row.keyring_fields:
            return
        from keyload.storage import keyring  # lazily: it loads processor code, which a client need not
        from keyload.storage.keyring import KeyringError

        try:
            held = keyring.load(self.data.root)
        except (OSError, KeyringError):
            return
        missing = row.keys_missing(body, held)
        if missing:
            raise InvalidCommand(
                f"{missing[0]} names no key of the keyring: add it first (keyload keys add); nothing was appended"
            )

    def _await(self, command_id: str, domain: str, timeout_s: float) -> Outcome:
        """Tail the reply partition for the outcome of (domain, command id), sealed with this
        client's key.

        The client reads on from where its last wait stopped (at most the
        partition's end, so nothing after the append is missed), which spares a
        broker round trip per command; outcomes of other clients sharing the
        partition are passed over, most without decoding. An outcome for the
        command that is not sealed with this client's key is not the service's
        answer to it (or the service could not authenticate the command): it is
        passed over, and named in the timeout's message if nothing else comes.
        """
        assert self._cursor is not None
        deadline = time.monotonic() + timeout_s
        pause = OUTCOME_POLL_MIN_S
        needle = command_id.encode()
        unsealed: list[Outcome] = []
        while True:
            # Checked before the read: the last read starts after the deadline, so a process
            # paused past it still finds an outcome that arrived meanwhile.
            expired = time.monotonic() >= deadline
            try:
                records = self._outcomes.read(self.reply_partition, self._cursor, OUTCOME_READ_BATCH)
            except LogTruncated:  # retention passed the position this client last read: its outcome is newer
                self._cursor = self._outcomes.start_offset(self.reply_partition)
                continue
            except LogCorruption as exc:
                then = "the command is in the log: send it again with the same command id to learn its outcome"
                raise self._damaged(exc, then) from exc
            for record in records:
                self._cursor = record.offset + 1
                if needle not in record.value:
                    continue
                found = self._matching(record.value, command_id, domain)
                if found is not None:
                    outcome, sealed = found
                    if sealed:
                        return outcome
                    unsealed.append(outcome)
            if records:
                continue
            if expired:
                raise OutcomeTimeout(command_id, timeout_s, unsealed_note(unsealed) + self._service_note(domain))
            time.sleep(pause)
            pause = min(pause * 2, OUTCOME_POLL_MAX_S)

    def _service_note(self, domain: str) -> str:
        """What this machine knows of why nothing answered: no `keyload run` serves the embedded
        directory, or the domain's partition is halted (the halt `keyload run` recorded here; on
        Kafka only the node that owns the partition records it). The command stays in the log
        either way, and applies once the partition is served again."""
        from keyload.service.embedded import is_served  # lazily: the service's modules, on a timeout only
        from keyload.service.halts import recorded_halts

        partition = partition_for(domain, self.data.partitions)
        halt = recorded_halts(self.data.root).get(partition)
        if halt is not None:
            return f"; partition {partition} is halted {halt.where} (see `keyload status`)"
        if self.data.kafka is not None:
            return (
                f"; on Kafka the processor that owns partition {partition} answers: `keyload status` on that "
                "node's data directory says whether it is halted (a halt is recorded where it happened)"
            )
        if not is_served(self.data.root):
            return f"; no `keyload run` serves {self.data.root}: the command waits in the log until one does"
        return f"; partition {partition} is busy or stalled (see `keyload status`)"

    def _matching(self, value: bytes, command_id: str, domain: str) -> tuple[Outcome, bool] | None:
        """(the outcome `value` holds, whether it is sealed with this client's key) when it is one
        for (domain, command id); None when it answers another command or is no outcome at all (a
        writer of the outcome stream that is not the service can append anything: what is not
        sealed is read only for the note a timeout gives)."""
        sealed = self.credential.seals(value)
        try:
            decoded = REGISTRY.decode("keyload.Outcome", contents(value))
            if decoded["command_id"] != command_id or decoded["domain"] != domain:
                return None
            return Outcome.from_record(decoded), sealed
        except UnknownSchema as exc:
            if sealed:  # the service's answer, written by a newer keyload than this client
                raise UnreadableOutcome(command_id, f"{exc} (a newer keyload's outcome schema)") from None
            return None
        except Exception:  # only bytes no service wrote get here: a sealed outcome decodes
            if sealed:
                raise
            return None
