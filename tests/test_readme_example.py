"""The README's Python example, run as written (its one ```python block) against a running `keyload
run` on the data directory it names: a reader copies it, so it must finish and do what it says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from keyload import Client

from .support import start_service, stop_service

README = Path(__file__).resolve().parent.parent / "README.md"
EXAMPLE_TIMEOUT_S = 180
PAYLOAD_BYTES = 300_000
# Run after the example, inside its `with Client(...) as client:` block.
CHECKS = """
    assert data == Path("video.mp4").read_bytes()
    assert [future.result().message_id for future in futures] == [receipt.message_id for receipt in receipts]
    print("the example finished")
"""


def python_example() -> str:
    (block,) = re.findall(r"```python\n(.*?)```", README.read_text("utf-8"), re.S)
    return str(block)


def test_the_readme_python_example_runs_as_written(tmp_path: Path) -> None:
    data = tmp_path / "keyload-data"
    service = start_service(data, "--listen", "none")
    try:
        (tmp_path / "video.mp4").write_bytes(os.urandom(PAYLOAD_BYTES))
        script = tmp_path / "example.py"
        script.write_text(python_example() + CHECKS, "utf-8")
        ran = subprocess.run(
            [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=EXAMPLE_TIMEOUT_S
        )
        assert ran.returncode == 0, ran.stderr[-4000:]
        assert ran.stdout.rstrip().endswith("the example finished")
        with Client(data) as client:
            orders = client.inspect_queue("shop", "orders").counters
            assert orders.enqueued_total == 1 + 1000 + 1  # order-1, the coalesced thousand, order-2
            assert orders.acked_total + orders.ready == orders.enqueued_total  # none lost, none twice
            shipments = client.inspect_queue("shop", "shipments").counters
            # Each shipment is an order the exactly-once handler completed: its document went with it.
            assert shipments.enqueued_total >= 1
            while deliveries := client.receive("shop", "shipments", max_messages=10).deliveries:
                for delivery in deliveries:
                    order = delivery.message_id.removeprefix("ship-")
                    assert client.get_document("shop", f"order/{order}").value == delivery.body
                    client.ack("shop", delivery.token)
    finally:
        assert stop_service(service, 30) == 0
