"""The command log: the source of truth every projection is rebuilt from."""
