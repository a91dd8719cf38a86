"""scripts/demo, the README's main command: it runs end to end and every narrated step happens.

The demo checks each step itself (scripts/demo.py exits 1 with "demo FAILED: ..." when keyload
does something else); here it runs as a user runs it, and its output must show the steps in one
screen. The first test reuses the test virtualenv (it holds the runtime too, so nothing is
installed); the second builds the runtime virtualenv from scratch, as on a fresh machine, and
checks that it holds no test tools.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "scripts" / "demo"
MAX_LINES = 45  # "one screen"
DEMO_TIMEOUT_S = 300.0  # it takes ~10 s; a hung demo fails instead of holding CI
FRESH_TIMEOUT_S = 600.0  # includes creating the virtualenv and installing from PyPI

NARRATED = (
    "enqueued order-1, order-2, order-3",
    "order-1: acked",
    "order-2, order-3: nacked on attempt 1, retry in 500 ms",
    "receive at once: nothing ready",
    "as attempt 2, acked",
    "retry in 1000 ms",
    "as attempt 3 of 3, nacked: dead-lettered",
    "dead letters of 'orders': order-3",
    "order-3: redriven",
    "order-3: received as attempt 1, acked",
    "$ keyload checkpoint --domain shop",
    "billing   2 behind, received evt-1, evt-2, acked both",
    "shipping  still 2 behind, received evt-1, evt-2, acked both",
    "creating a queue: PermissionDenied, the principal holds no resource_manage grant",
    "$ keyload drill --domain shop --quiet",
    "$ keyload drill --domain shop --from-checkpoint latest --quiet",
    "demo: all steps behaved as shown",
)


def run_demo(tmp_path: Path, venv: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "KEYLOAD_DATA")}
    env["KEYLOAD_VENV"] = str(venv)
    env["KEYLOAD_DATA"] = str(tmp_path / "demo-data")
    return subprocess.run([str(DEMO)], capture_output=True, text=True, env=env, timeout=timeout_s, cwd=tmp_path)


def assert_narrated(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for line in NARRATED:
        assert line in out, f"{line!r} missing from:\n{out}"
    assert out.count(": PASS") == 2 and "FAIL" not in out, out
    assert len(out.splitlines()) <= MAX_LINES, out
    assert "{" not in out, f"a dict or JSON dump in:\n{out}"
    assert "Traceback" not in result.stderr, result.stderr


def test_demo_runs_every_step_in_one_screen(tmp_path: Path) -> None:
    assert sys.prefix != sys.base_prefix, "the tests run in a virtualenv, which the demo reuses"
    result = run_demo(tmp_path, Path(sys.prefix), DEMO_TIMEOUT_S)
    assert_narrated(result)
    assert not (tmp_path / "demo-data.run.log").read_text().count("Traceback")


def test_demo_on_a_fresh_machine_installs_only_the_runtime(tmp_path: Path) -> None:
    venv = tmp_path / "fresh-venv"
    result = run_demo(tmp_path, venv, FRESH_TIMEOUT_S)
    assert_narrated(result)
    assert (venv / "bin" / "keyload").exists()
    listed = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    installed = {line.split("==")[0].lower() for line in listed.splitlines()}
    assert "keyload" in installed and "rocksdict" in installed, listed
    for tool in ("pytest", "mypy", "ruff", "moto", "hypothesis"):
        assert tool not in installed, f"{tool} in the runtime virtualenv:\n{listed}"

    # A second run installs nothing and starts over on a fresh data directory.
    (tmp_path / "demo-data").rename(tmp_path / "first-data")
    again = run_demo(tmp_path, venv, DEMO_TIMEOUT_S)
    assert_narrated(again)
    assert "installing keyload" not in again.stderr
