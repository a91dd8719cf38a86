"""The partition's due index and next due time (`processors/queues/state.py`), against a model.

Every queue and group with timers keeps one due-index entry at its earliest timer, and the partition
keeps the earliest of them as its next due time, which the ticker reads on every record. A move reads
the index only when the entry left the first due time for a later one; the model checks that the
next due time is the first entry's after every move, across groups committed to RocksDB and commands
staged over them, with ties at one due time between resources."""

from __future__ import annotations

import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st

from keyload.processors.queues.state import move_due_entry, next_due_ms
from keyload.projections import keys
from keyload.projections.store import Staged, Store

RESOURCES = 5


class Looking(Staged):
    """A command's stage that counts the lookups of the first row of a range."""

    lookups = 0

    def first(self, start: bytes, end: bytes) -> tuple[bytes, bytes] | None:
        self.lookups += 1
        return super().first(start, end)


DUE_TIMES = st.one_of(st.none(), st.integers(1, 6))  # few times: many ties


@settings(max_examples=300, deadline=None)
@given(
    groups=st.lists(
        st.lists(st.tuples(st.integers(0, RESOURCES - 1), DUE_TIMES), min_size=1, max_size=8),
        min_size=1,
        max_size=8,
    )
)
def test_the_next_due_time_is_the_first_entry_after_every_move(groups: list[list[tuple[int, int | None]]]) -> None:
    entries: dict[int, int] = {}  # resource -> its due time: the model
    with tempfile.TemporaryDirectory() as directory:
        store = Store(directory)
        try:
            for offset, moves in enumerate(groups):
                group = Staged(store)
                for resource, earliest in moves:
                    command = Looking(group)  # as the processor stages each command over its group
                    previous, current = entries.get(resource), min(entries.values(), default=None)
                    move_due_entry(command, resource, previous, earliest)
                    left_first = (
                        previous is not None and previous == current and (earliest is None or earliest > current)
                    )
                    assert command.lookups == (1 if left_first or current is None is earliest else 0)
                    command.merge_into(group)
                    if earliest is None:
                        entries.pop(resource, None)
                    else:
                        entries[resource] = earliest
                    rows = group.scan(keys.DUE_QUEUE, keys.prefix_end(keys.DUE_QUEUE))
                    index = [keys.parse_due_queue(key) for key, _ in rows]
                    assert index == sorted((due, resource) for resource, due in entries.items())
                    assert next_due_ms(group) == min(entries.values(), default=None)
                store.commit(group.encoded_writes(), offset, 0)
            assert next_due_ms(store) == min(entries.values(), default=None)
        finally:
            store.close()
