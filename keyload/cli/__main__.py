"""`python -m keyload.cli`: the keyload command line."""

from keyload.cli import main

raise SystemExit(main())
