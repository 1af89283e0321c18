"""The code standards, enforced: ruff and mypy --strict on streamrec/, C accelerators built.

The structure rules (import cycles, private imports, module sizes, the sans-I/O format core)
are in unit/test_architecture.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from streamrec.format.accel import pure_python_requested

ROOT = Path(__file__).resolve().parents[2]


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)


def test_ruff_is_clean() -> None:
    done = run(sys.executable, "-m", "ruff", "check", "streamrec", "tests", "examples")
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_strict_is_clean() -> None:
    done = run(sys.executable, "-m", "mypy", "--strict", "streamrec")
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.skipif(pure_python_requested(), reason="STREAMREC_PURE_PYTHON=1: C paths not wanted")
def test_c_accelerators_are_built() -> None:
    # Without this, a broken compiler would silently leave CI testing only the fallbacks.
    from streamrec.format import _cexample, _cframing  # type: ignore[attr-defined]
    from streamrec.storage import _cread  # type: ignore[attr-defined]

    assert _cframing.has_hardware_crc() in (True, False)
    assert _cexample is not None
    assert _cread is not None
