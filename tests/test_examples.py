"""Every example runs against local files and says what it promises."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("quickstart.py", "pixels agree with labels: True"),
        ("remote_streaming.py", "identical to the uninterrupted order"),
        ("training_loop.py", "identical to one run"),
        ("reshard.py", "exactly once"),
    ],
)
def test_example_runs(script: str, expected: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(EXAMPLES.parent))
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert expected in done.stdout, done.stdout
