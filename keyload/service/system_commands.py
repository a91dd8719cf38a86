"""Commands the service's own actors append: Ticks, EnableAccessControl, RaiseFeatureLevel, CheckpointPublished.

Each is partition-wide: it concerns a partition, not a domain, so it is sent under a
stable domain name that maps to that partition, by a system principal
(keyload/storage/principals.py), with no reply partition (nobody waits for it).
"""

from __future__ import annotations

from typing import Any

from keyload import limits
from keyload.commands import BY_NAME
from keyload.credentials import Credential
from keyload.log.base import partition_for
from keyload.log.codec import REGISTRY

MAX_SYSTEM_DOMAIN_PROBES = 1_000_000


def domain_for_partition(partition: int, partitions: int) -> str:
    """A stable domain name that maps to `partition`, for partition-wide commands."""
    for n in range(MAX_SYSTEM_DOMAIN_PROBES):
        candidate = f"keyload-system-{n}"
        if partition_for(candidate, partitions) == partition:
            return candidate
    raise AssertionError("no domain maps to the partition")


def system_command(
    credential: Credential, name: str, body: dict[str, Any], *, partition: int, partitions: int, command_id: str
) -> bytes:
    """The signed record of the partition-wide command `name` (a row of the command table) that
    `credential`'s principal sends to `partition` of `partitions`."""
    envelope = {
        "command_id": command_id,
        "domain": domain_for_partition(partition, partitions),
        "principal": credential.principal,
        "body": (BY_NAME[name].branch, body),
        "reply_to": None,
        "client_time_ms": None,
    }
    return credential.sign(REGISTRY.encode("keyload.Command", envelope))


def feature_level_command(credential: Credential, partition: int, partitions: int) -> bytes:
    """The RaiseFeatureLevel record moving `partition` to the highest feature level this processor
    knows (processors/features.py). The same bytes from every service of one version: a repeat, or
    one a partition already applied, changes nothing."""
    level = limits.FEATURE_LEVEL
    return system_command(
        credential,
        "RaiseFeatureLevel",
        {"level": level},
        partition=partition,
        partitions=partitions,
        command_id=f"raise-feature-level-{level}-p{partition}",
    )
