"""Turning access control on: the EnableAccessControl command `keyload run` appends to a
partition that has not applied one (processors/access.py says what it changes).

The command is the same bytes in every service over one log: a fixed command id per partition,
the system principals of keyload/storage/principals.py under their fixed key ids, signed with
the administrator's keyring key. So a second service (or a restart before the first was applied)
appends a repeat, which the partition refuses (`Conflict`: access control is on), changing nothing;
its outcome is not stored, so no command before it can take its id.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from keyload.credentials import ADMIN_PRINCIPAL
from keyload.log.base import CommandLog
from keyload.service.system_commands import system_command
from keyload.storage.principals import SYSTEM_PRINCIPALS, system_credential, system_key_id

EVERYTHING = "*"


def enable_command(root: Path, partition: int, partitions: int) -> bytes:
    """The signed EnableAccessControl record for `partition`."""
    principals = [
        {
            "principal": principal,
            "key_id": system_key_id(principal),
            "grants": [{"capability": capability.value, "domain": EVERYTHING, "resource": EVERYTHING}],
        }
        for principal, capability in SYSTEM_PRINCIPALS
    ]
    return system_command(
        system_credential(root, ADMIN_PRINCIPAL),
        "EnableAccessControl",
        {"principals": principals},
        partition=partition,
        partitions=partitions,
        command_id=f"enable-access-control-p{partition}",
    )


def enable(root: Path, log: CommandLog, partitions: Iterable[int]) -> None:
    """Append EnableAccessControl to each of `partitions` (of `log.partitions`)."""
    for partition in partitions:
        log.append(partition, [enable_command(root, partition, log.partitions)])
