"""The HTTP API from a client that is not Python: tests/node/http_client.mjs, Node's built-in fetch only,
against one real `keyload run`.

It drives a queue (enqueue, receive, nack, redelivery, ack) and a subscription group (create, publish,
receive, ack) by the JSON rules of keyload/wire.py alone, and checks two refusals: no credential (401
Unauthenticated) and an ack of a token already acked (StaleLease). Without `node` on PATH the test fails
under CI (a broken setup) and skips elsewhere, saying why.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from .support import bearer, served_url, start_service, stop_service, unavailable_in_ci

CLIENT = Path(__file__).resolve().parent / "node" / "http_client.mjs"
CLIENT_TIMEOUT_S = 120
BEARER_PREFIX = "Bearer "
STEPS = 13  # the steps http_client.mjs runs: 11 of the happy path, 2 refusals


def test_node_client_drives_the_http_api(tmp_path: Path) -> None:
    node = shutil.which("node")
    if node is None:
        unavailable_in_ci("Node.js", "`node` is not on PATH")
    root = tmp_path / "data"
    process = start_service(root)
    try:
        url = served_url(root)
        authorization = bearer(root)["Authorization"]
        assert authorization.startswith(BEARER_PREFIX)
        token = authorization.removeprefix(BEARER_PREFIX)
        ran = subprocess.run([node, str(CLIENT), url, token], capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S)
    finally:
        assert stop_service(process) == 0
    shown = f"stdout:\n{ran.stdout}\nstderr:\n{ran.stderr}"
    assert ran.returncode == 0, shown
    lines = ran.stdout.strip().splitlines()
    assert lines and lines[-1] == f"node client: {STEPS} steps passed", shown
