"""The ``streamrec`` console script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import streamrec
from streamrec.cli import main


def test_version_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert streamrec.__version__ in capsys.readouterr().out
    assert main([]) == 0
    assert "count" in capsys.readouterr().out


def test_count_prints_per_file_and_total(
    corpus_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["count", str(corpus_dir / "sharded" / "*.tfrecord")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out] == ["4", "0", "6", "2", "3", "15"]


def test_count_reports_damage_with_exit_status_1(
    corpus_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = corpus_dir / "corrupt" / "flipped_payload_bit_rec2.tfrecord"
    assert main(["count", str(path)]) == 1
    assert "at byte offset 507: payload CRC mismatch" in capsys.readouterr().err
    assert main(["count", "--skip-corrupt", str(path)]) == 0
    assert "1 corrupt skipped" in capsys.readouterr().out


def test_console_script_entry_point_runs() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "streamrec.cli", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "count" in done.stdout
