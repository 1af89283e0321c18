"""Every example runs against local files and says what it promises."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("quickstart.py", "pixels agree with labels: True"),
        ("remote_streaming.py", "identical to the uninterrupted order"),
        ("training_loop.py", "identical to one run"),
        ("reshard.py", "exactly once"),
    ],
)
def test_example_runs(script: str, expected: str, tmp_path: Path) -> None:
    temp = tmp_path / "tmp"  # the examples' temporary files go here: it must end up empty
    temp.mkdir()
    env = dict(os.environ, PYTHONPATH=str(EXAMPLES.parent), TMPDIR=str(temp))
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert expected in done.stdout, done.stdout
    left = [p.name for p in temp.iterdir() if not p.name.startswith("torchinductor_")]
    assert left == [], "the example left temporary files behind (torch's own cache aside)"
