"""The `keyload` command line (entry point `keyload.cli:main`); see keyload/cli/main.py.

Modules: `main` (parser, error path, exit codes), `commands` (subcommands derived from the
command table), `operations` (run, drill, replay, status, gc, ...), `output` (JSON and text),
`schema` (command bodies' Avro records, read as JSON).
"""

from __future__ import annotations

from keyload.cli.main import EXIT_CODES, EXIT_FAILED, EXIT_USAGE, build_parser, main
from keyload.cli.output import UsageError

__all__ = ["EXIT_CODES", "EXIT_FAILED", "EXIT_USAGE", "UsageError", "build_parser", "main"]
