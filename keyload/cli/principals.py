"""`keyload principal ...` and `keyload whoami`: principals, grants and credentials from the command line.

A grant is written CAPABILITY:DOMAIN[:RESOURCE] (`consume:orders`, `enqueue:shop-*:jobs`,
`admin:*`); a capability may be spelled with '-' or '_' (`dead-letter-read`). DOMAIN and RESOURCE
are exact names, prefixes ending in '*', or '*'; RESOURCE defaults to '*'. Principal commands go to
every partition (keyload/sdk/client.py `put_principal`).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from keyload.cli.commands import partition_number
from keyload.cli.output import UsageError, emit
from keyload.commands import Capability

if TYPE_CHECKING:
    from keyload.projections.records import Grant


def parse_grant(text: str) -> Grant:
    from keyload.projections.records import Grant

    parts = text.split(":")
    if len(parts) not in (2, 3) or not all(parts):
        raise UsageError(f"a grant is CAPABILITY:DOMAIN[:RESOURCE], not {text!r}")
    name = parts[0].replace("-", "_")
    if name not in Capability.__members__:
        known = ", ".join(capability.value.replace("_", "-") for capability in Capability)
        raise UsageError(f"unknown capability {parts[0]!r}; one of {known}")
    return Grant(capability=Capability[name], domain=parts[1], resource=parts[2] if len(parts) == 3 else "*")


def _client(args: argparse.Namespace) -> Any:
    from keyload.cli.main import client_of

    return client_of(args)


def create(args: argparse.Namespace) -> int:
    from keyload.credentials import credential_path

    grants = [parse_grant(text) for text in args.grant]
    with _client(args) as client:
        credential = client.create_principal(args.name, grants, key_id=args.key_id, command_id=args.command_id)
        view = client.inspect_principal(args.name)
    path = credential_path(client.data.root, credential.principal)
    emit(args, {"credential": str(path), "principal": view.principal, "policy_epoch": view.policy_epoch})
    return 0


def rotate(args: argparse.Namespace) -> int:
    from keyload.credentials import credential_path

    with _client(args) as client:
        credential = client.rotate_credential(args.name, key_id=args.key_id, command_id=args.command_id)
    emit(
        args, {"credential": str(credential_path(client.data.root, credential.principal)), "key_id": credential.key_id}
    )
    return 0


def grant(args: argparse.Namespace) -> int:
    with _client(args) as client:
        emit(args, client.grant(args.name, parse_grant(args.grant), command_id=args.command_id))
    return 0


def revoke(args: argparse.Namespace) -> int:
    with _client(args) as client:
        emit(args, client.revoke(args.name, parse_grant(args.grant), command_id=args.command_id))
    return 0


def enable(args: argparse.Namespace) -> int:
    with _client(args) as client:
        emit(args, client.put_principal(args.name, enabled=args.enabled, command_id=args.command_id))
    return 0


def inspect(args: argparse.Namespace) -> int:
    with _client(args) as client:
        emit(args, client.inspect_principal(args.name, partition=args.partition))
    return 0


def whoami(args: argparse.Namespace) -> int:
    with _client(args) as client:
        emit(args, client.whoami())
    return 0


def add_parsers(sub: Any, common: argparse.ArgumentParser, command: argparse.ArgumentParser) -> None:
    """The principal verbs; those that change a principal take `--command-id` (`command`): one sent
    to every partition that failed part-way is completed by sending it again with the same id."""
    changes = [common, command]
    principal = sub.add_parser("principal", help="principals, their grants and credentials").add_subparsers(
        dest="action", required=True, metavar="VERB"
    )
    grant_help = "CAPABILITY:DOMAIN[:RESOURCE], e.g. consume:orders or enqueue:shop-*:jobs"
    key_id_help = (
        "sign with this keyring key (added with `keyload keys add`) instead of a new one; on Kafka, copy the "
        "keyring to every processor first (default: a new key of this command, the same again when it is "
        "sent again with its --command-id)"
    )
    op = principal.add_parser(
        "create", parents=changes, help="a new principal and its credential file DATA/credentials/NAME.json (0600)"
    )
    op.add_argument("name", help="the principal")
    op.add_argument("--grant", action="append", default=[], metavar="GRANT", help=grant_help + " (repeatable)")
    op.add_argument("--key-id", help=key_id_help)
    op.set_defaults(func=create)
    op = principal.add_parser("grant", parents=changes, help="add a grant")
    op.add_argument("name", help="the principal")
    op.add_argument("grant", help=grant_help)
    op.set_defaults(func=grant)
    op = principal.add_parser("revoke", parents=changes, help="remove a grant, exactly as granted")
    op.add_argument("name", help="the principal")
    op.add_argument("grant", help=grant_help)
    op.set_defaults(func=revoke)
    for verb, enabled, text in (
        ("disable", False, "refuse every command the principal signs"),
        ("enable", True, "accept its commands again"),
    ):
        op = principal.add_parser(verb, parents=changes, help=text)
        op.add_argument("name", help="the principal")
        op.set_defaults(func=enable, enabled=enabled)
    op = principal.add_parser(
        "rotate", parents=changes, help="a new key and credential file; the old key signs nothing from now on"
    )
    op.add_argument("name", help="the principal")
    op.add_argument("--key-id", help=key_id_help)
    op.set_defaults(func=rotate)
    op = principal.add_parser("inspect", parents=[common], help="a principal's key id, grants and revision (admin)")
    op.add_argument("name", help="the principal")
    op.add_argument("--partition", type=partition_number, default=0, metavar="N", help="whose policy (default 0)")
    op.set_defaults(func=inspect)
    op = sub.add_parser("whoami", parents=[common], help="the principal this command line acts as, and its grants")
    op.set_defaults(func=whoami)
