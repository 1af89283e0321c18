"""The README runs as written: every code block is executed here, so the README cannot drift.

The Python blocks run top to bottom as one script in a fresh process, in an empty directory,
with S3 pointed at the test's moto server through the environment variables boto3 reads
(``AWS_ENDPOINT_URL``, credentials), as a user would set them for MinIO. The "Training loops"
block is run the way jobs really end: killed in the middle of a training step, restarted, killed
again, restarted; every record must reach ``train_step`` exactly once across the runs, in the
order of one uninterrupted run. The command-line block runs line by line afterwards. The first
block (install, then the test command) is what ``.ci/run`` runs.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from support.servers import MotoS3Server

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
BUCKET = "my-bucket"

#: ``train_step`` for the README's loop: logs each record of a batch it completes, and
#: simulates a preempted job by exiting in the middle of step number $README_KILL_AT.
PRELUDE = """
import hashlib as _hashlib, os as _os, sys as _sys
_steps = 0
def train_step(batch):
    global _steps
    _steps += 1
    if _steps == int(_os.environ.get("README_KILL_AT", "0")):
        _os._exit(75)  # killed mid-step: nothing after it runs, no cleanup
    with open("trained.log", "a") as _log:
        for label, image in zip(batch["label"], batch["image_raw"]):
            _log.write(f"{int(label)} {_hashlib.sha1(image.tobytes()).hexdigest()}\\n")
"""


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", README, flags=re.S | re.M)


#: Blocks that start a cluster of their own (seconds each run): run once, in the uninterrupted
#: run, not again in the restarts or the command-line test, which do not depend on them.
SLOW_BLOCKS = ("import ray",)


def script(skip: tuple[str, ...] = ()) -> str:
    kept = [block for block in blocks("python") if not any(mark in block for mark in skip)]
    return PRELUDE + "\n".join(kept)


@pytest.fixture
def readme_env(s3_server: MotoS3Server) -> dict[str, str]:
    if BUCKET not in [b["Name"] for b in s3_server.client.list_buckets()["Buckets"]]:
        s3_server.create_bucket(BUCKET)
    return dict(
        os.environ,
        AWS_ENDPOINT_URL=s3_server.endpoint_url,
        AWS_ACCESS_KEY_ID=s3_server.storage_options["key"],
        AWS_SECRET_ACCESS_KEY=s3_server.storage_options["secret"],
        PYTHONPATH=str(ROOT),
    )


def run_script(
    directory: Path, env: dict[str, str], kill_at: int = 0, skip: tuple[str, ...] = ()
) -> int:
    (directory / "readme.py").write_text(script(skip))
    done = subprocess.run(
        [sys.executable, "readme.py"],
        cwd=directory,
        env=dict(env, README_KILL_AT=str(kill_at)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode in (0, 75), done.stderr
    return done.returncode


def test_the_readme_has_the_blocks_this_test_runs() -> None:
    assert "pip install -e . && python examples/quickstart.py" in blocks("bash")[0]
    assert "python -m pytest" in blocks("bash")[0]
    assert any("train_step(batch)" in block for block in blocks("python"))
    assert any(line.startswith("streamrec ") for line in blocks("bash")[1].splitlines())


@pytest.mark.slow  # the whole README seven times, Ray once: `pytest -m slow`
def test_python_blocks_and_the_training_loop_resume_exactly_after_kills(
    tmp_path: Path, readme_env: dict[str, str]
) -> None:
    whole = tmp_path / "uninterrupted"
    whole.mkdir()
    assert run_script(whole, readme_env) == 0
    expected = (whole / "trained.log").read_text().splitlines()
    assert len(expected) == 3 * 256  # 3 epochs of the 4 x 64 records the first block writes

    killed = tmp_path / "killed"
    killed.mkdir()
    # killed in step 1, in the last step of an epoch, at another step, in the very last one;
    # each restart counts its steps from 1 again
    for kill_at in (1, 4, 3, 7):
        assert run_script(killed, readme_env, kill_at, SLOW_BLOCKS) == 75
    assert run_script(killed, readme_env, skip=SLOW_BLOCKS) == 0
    assert (killed / "trained.log").read_text().splitlines() == expected


@pytest.mark.slow
def test_command_line_block_runs(tmp_path: Path, readme_env: dict[str, str]) -> None:
    assert run_script(tmp_path, readme_env, skip=SLOW_BLOCKS) == 0  # the data the commands read
    commands = blocks("bash")[1].replace("\\\n", " ")
    for line in commands.splitlines():
        words = shlex.split(line, comments=True)
        assert words[0] == "streamrec", line
        done = subprocess.run(
            [sys.executable, "-m", "streamrec.cli", *words[1:]],
            cwd=tmp_path,
            env=readme_env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
        if "--json" in words:
            json.loads(done.stdout)
