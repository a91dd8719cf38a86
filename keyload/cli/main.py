"""The `keyload` command line: one grammar, `keyload <noun> <verb>`, for every family.

Commands of the command table (keyload/commands.py) are derived from it
(keyload/cli/commands.py): `queue create|configure|inspect|enqueue|receive`,
`message inspect|redrive|cancel|park`, `lease ack|ack-batch|nack|renew`, `dlq list`,
`topic create|inspect|publish|read|purge`, `group ...`, `doc ...`, `inbox configure`,
`keys rotate`. The old top-level verbs stay as aliases of the same parsers: `enqueue`,
`receive` (queue ...), `ack`, `nack`, `renew` (lease ...), `publish`, `read` (topic ...),
`redrive`, `cancel`, `park` (message ...), `stats` (queue inspect, as text) and `inspect`
(queue inspect, or message inspect with --message). Operational commands are hand-written
(keyload/cli/operations.py): `run`, `checkpoint`, `replay`, `drill`, `restore`, `status`, `census`,
`poison list`, `log truncate`, `keys add`, `payload schedule|get`, `gc status|run|release-pin`.

Output: `--json` prints the full result as JSON, `--output text` a readable summary; the default
is text on a terminal, JSON into a pipe (keyload/cli/output.py). Logging: `--log-level`,
`--log-format text|json` (keyload/logs.py), on stderr.

Errors: every command runs inside `keyload.errors.map_exceptions()`; whatever it raises is then
a `KeyloadError`, printed as one line, `keyload: <message>` on stderr (`keyload: rejected:
<code>: <detail>` for a rejected command), and the process exits with the code of the first
class in EXIT_CODES it is an instance of:

    0    success
    1    any KeyloadError (a rejected command, a timeout, a bad data directory, a failed drill, ...);
         also `lease ack`/`group ack` of several tokens when one was not committed
    2    UsageError and argparse's own usage errors (bad command-line input)
    130  interrupted (Ctrl-C)
    141  the output's reader left (`keyload ... | head`): nothing is printed

`keyload --help` and `keyload <noun> <verb> --help` import none of the engine: handlers import
what they need when they run.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from keyload.cli import commands, operations, principals
from keyload.cli.output import UsageError
from keyload.errors import CommandRejected, KeyloadError, map_exceptions

if TYPE_CHECKING:
    from keyload.sdk.client import Client

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_OUTPUT_CLOSED = 141  # what a shell reports for a process its pipe's reader left (128 + SIGPIPE)
EXIT_CODES: tuple[tuple[type[KeyloadError], int], ...] = (
    (UsageError, EXIT_USAGE),
    (KeyloadError, EXIT_FAILED),
)

log = logging.getLogger("keyload.cli")


def client_of(args: argparse.Namespace) -> Client:
    from keyload.credentials import Credential
    from keyload.sdk.client import Client

    credential = None if args.credential is None else Credential.load(Path(args.credential))
    return Client(args.data, principal=args.acting_as, timeout_s=args.timeout, credential=credential)


def exit_code(exc: KeyloadError) -> int:
    return next(code for cls, code in EXIT_CODES if isinstance(exc, cls))


def _common() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--data",
        default=operations.env_data(),
        metavar="DIR",
        help="data directory (default: $KEYLOAD_DATA or ./keyload-data)",
    )
    common.add_argument(
        "--as",
        dest="acting_as",
        default=None,
        metavar="PRINCIPAL",
        help="act as this principal, signing with its credential file DATA/credentials/PRINCIPAL.json "
        "(default: the --credential file, else the administrator, keyload-admin)",
    )
    common.add_argument(
        "--credential",
        default=os.environ.get("KEYLOAD_CREDENTIAL"),
        metavar="FILE",
        help="the credential file to sign with (default: $KEYLOAD_CREDENTIAL)",
    )
    common.add_argument(
        "--timeout",
        type=commands.positive_seconds,
        default=operations.DEFAULTS["timeout"],
        metavar="SECONDS",
        help="seconds to wait for an outcome (default 10)",
    )
    output = common.add_mutually_exclusive_group()
    output.add_argument(
        "--json",
        dest="output",
        action="store_const",
        const="json",
        default="auto",
        help="machine output: the full result as JSON",
    )
    output.add_argument(
        "--output",
        choices=("auto", "json", "text"),
        default="auto",
        help="json, text (a readable summary) or auto: text on a terminal, JSON into a pipe (default auto)",
    )
    common.add_argument(
        "--log-level",
        default="warning",
        choices=("debug", "info", "warning", "error"),
        help="keyload's log records on stderr at this level and above (default warning)",
    )
    common.add_argument(
        "--log-format",
        default="text",
        choices=("text", "json"),
        help="log lines as `keyload: message` text or one JSON object per line (default text)",
    )
    command = argparse.ArgumentParser(add_help=False)
    command.add_argument(
        "--command-id",
        type=commands.command_id,
        help="stable id for retries: the same id returns the first outcome (default: a new UUID)",
    )
    return common, command


class _Parser(argparse.ArgumentParser):
    """argparse, its usage errors one line on stderr as every other error is (`keyload: ...`), with
    where the options are shown instead of the whole usage; its subcommands' parsers are of this
    class too (argparse makes them of their parent's)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Whose options a usage error found after parsing (a range, a pair of options) points at:
        # the deepest command's, as a subcommand's defaults override its parent's.
        self.set_defaults(options_of=self.prog)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"keyload: {message} (`{self.prog} --help` shows the options)\n")

    def parse_known_args(  # type: ignore[override]  # one signature for argparse's three overloads
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """A command's own parser refuses what it does not know, so the error names its `--help`
        (argparse would pass the strings up, and the top parser name `keyload --help`)."""
        parsed, extras = super().parse_known_args(args, namespace)
        if extras and self._subparsers is None:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras


def build_parser(table: commands.Table = commands.TABLE) -> argparse.ArgumentParser:
    """The whole command line; `table`: what the table-derived subcommands are built from."""
    common, command = _common()
    parser: argparse.ArgumentParser = _Parser(
        prog="keyload",
        description="keyload: durable messaging on an event-sourced log. Grammar: keyload NOUN VERB [options].",
        epilog="Aliases: enqueue, receive, inspect, stats (queue); ack, nack, renew (lease); publish, read (topic); "
        "redrive, cancel, park (message).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    nouns = commands.add_table_commands(sub, [common, command], table)
    operations.add_keys_add(nouns["keys"], common)
    operations.add_parsers(sub, common, command)
    principals.add_parsers(sub, common, command)
    return parser


def main(argv: list[str] | None = None, table: commands.Table = commands.TABLE) -> int:
    args = build_parser(table).parse_args(argv)
    from keyload import logs

    logs.configure(args.log_level, json=args.log_format == "json")
    try:
        with map_exceptions():
            try:
                code: int = args.func(args)
            except BrokenPipeError:
                return _output_closed()
        return code
    except CommandRejected as exc:
        log.error("rejected: %s", exc)
        return exit_code(exc)
    except UsageError as exc:
        log.error("%s (`%s --help` shows the options)", exc, args.options_of)
        return exit_code(exc)
    except KeyloadError as exc:
        log.error("%s", exc)
        return exit_code(exc)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def _output_closed() -> int:
    """The reader of the output left (`keyload ... | head`): nothing more to say, and nobody to say it
    to; stdout goes to /dev/null so that the interpreter's last flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return EXIT_OUTPUT_CLOSED


if __name__ == "__main__":
    sys.exit(main())
