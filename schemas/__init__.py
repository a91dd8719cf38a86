"""Avro schemas: the public contract of commands, outcomes and stored records.

Files are named by the full name of the type they define, so a schema that
refers to another type is resolved from the file of that name. `history/<name>/vN.avsc`
holds every released writer version of each top-level schema, fully expanded.
"""
