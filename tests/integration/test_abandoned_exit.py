"""A script that takes a few records and ends exits: an abandoned blocking iterator never
keeps the process alive.

``it = iter(ds); next(it)`` at module level leaves the iterator to the interpreter's
shutdown, which finalised it once its loop's daemon thread had stopped for good: closing
waited for that loop forever, deaf to Ctrl-C. Each pipeline shape runs in a subprocess
(C and pure Python) that must end by itself with rc 0 and a stderr free of tracebacks; a
hang is the subprocess timeout, a failure. The timeout is generous: nothing is timed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import streamrec
from streamrec.example import encode
from support.servers import MotoS3Server

REPO = Path(__file__).resolve().parents[2]
RECORDS_PER_SHARD = 300
HANG = 60  # seconds: far beyond an exit, a hang is what it catches

SCRIPT_HEAD = r"""
import json, os, sys
import numpy as np
import streamrec
from streamrec.example import FixedLenFeature

options, urls = json.loads(sys.argv[1]), sys.argv[2:]
spec = {"idx": FixedLenFeature(np.int64)}


def dataset(**kw):
    return streamrec.open_dataset(urls, block_bytes=4 << 10, storage_options=options, **kw)
"""

# what each script does, at module level unless it says otherwise; every one prints "ok"
SHAPES = {
    "records": """
it = iter(dataset())
next(it)
""",
    "parse-batch": """
it = iter(dataset().parse(spec).batch(4))
assert len(next(it)["idx"]) == 4
""",
    "mix": """
it = iter(streamrec.mix([dataset(), dataset(shuffle_shards=True, seed=1)], seed=0))
next(it)
""",
    "repeat": """
it = iter(dataset().repeat(2))
next(it)
""",
    "global-shuffle": """
it = iter(dataset(shuffle="global", prefetch_bytes=64 << 10))
next(it)
""",
    "buffer-shuffle": """
it = iter(dataset(shuffle_buffer=64, shuffle_shards=True))
next(it)
""",
    "for-break": """
for record in dataset().map(len):
    break
""",
    "several-open": """
a, b = iter(dataset()), iter(dataset().parse(spec))
next(a), next(b)
""",
    # (closed by their own finally while the loop runs: they always exited; kept so that
    # closing at exit does not change them)
    # dropped while its loop runs: closed by its own finally, not at exit
    "in-a-function": """
def first():
    it = iter(dataset(shuffle="global"))
    return next(it)
first()
""",
    "del": """
it = iter(dataset())
next(it)
del it
""",
    # a forked child's copy of an open iterator: its loop's thread is not in the child
    "fork-child": """
it = iter(dataset())
next(it)
pid = os.fork()
if pid == 0:
    del it
    sys.exit(0)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0
it.close()  # (the parent's own: only the child's copy is left to the exit)
""",
    "dataloader": """
from torch.utils.data import DataLoader
import streamrec.torch
it = iter(DataLoader(streamrec.torch.IterableDataset(dataset()), batch_size=None))
next(it)
""",
    "dataloader-workers": """
from torch.utils.data import DataLoader
import streamrec.torch
loader = DataLoader(streamrec.torch.IterableDataset(dataset()), batch_size=None, num_workers=2)
it = iter(loader)
next(it)
""",
}
NEEDS_TORCH = {"dataloader", "dataloader-workers"}


def write_shards(urls: list[str], options: dict[str, Any] | None = None) -> list[str]:
    """Indexed shards of Examples (an index: ``shuffle="global"`` reads by it)."""
    for s, url in enumerate(urls):
        first = s * RECORDS_PER_SHARD
        with streamrec.sync.open_writer(url, index=True, storage_options=options) as writer:
            writer.write_many(
                encode({"idx": np.int64(first + i)}) for i in range(RECORDS_PER_SHARD)
            )
    return urls


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    directory = tmp_path_factory.mktemp("abandoned")
    return write_shards([str(directory / f"part-{s}.tfrecord") for s in range(3)])


def run_script(
    body: str, urls: list[str], pure_python: bool, options: dict[str, Any] | None = None
) -> None:
    """``body`` run after ``SCRIPT_HEAD`` in a new interpreter: it ends by itself, quietly."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("STREAMREC_PURE_PYTHON", None)
    if pure_python:
        env["STREAMREC_PURE_PYTHON"] = "1"
    script = SCRIPT_HEAD + body + '\nprint("ok", flush=True)\n'
    proc = subprocess.run(
        [sys.executable, "-c", script, json.dumps(options), *urls],
        capture_output=True,
        text=True,
        timeout=HANG,
        cwd=REPO,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "ok\n", proc.stdout
    for sign in ("Traceback", "Exception ignored", "Error", "Warning", "never awaited", "Unclosed"):
        assert sign not in proc.stderr, proc.stderr


@pytest.mark.parametrize("pure_python", [False, True], ids=["c", "pure-python"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_script_that_abandons_an_iterator_exits(
    shards: list[str], shape: str, pure_python: bool
) -> None:
    if shape in NEEDS_TORCH:
        pytest.importorskip("torch.utils.data")
    run_script(SHAPES[shape], shards, pure_python)


@pytest.mark.parametrize("shape", ["records", "global-shuffle", "mix"])
def test_a_script_that_abandons_an_s3_iterator_exits(
    s3_server: MotoS3Server, s3_bucket: str, shape: str
) -> None:
    # (connections and sessions open: closed at exit, not reported unclosed)
    options = s3_server.storage_options
    urls = [f"s3://{s3_bucket}/abandoned/part-{s}.tfrecord" for s in range(3)]
    run_script(SHAPES[shape], write_shards(urls, options), False, options)


@pytest.mark.slow  # seconds: in the slow step
def test_a_script_that_abandons_a_read_with_shards_open_ahead_exits(
    s3_server: MotoS3Server, s3_bucket: str
) -> None:
    # read one at a time, the next shards (one block each at the default sizes) are opened
    # ahead of their turn, up to max_concurrency of them, their requests in flight
    options = s3_server.storage_options
    urls = [f"s3://{s3_bucket}/abandoned-ahead/part-{s:02d}.tfrecord" for s in range(20)]
    body = """
it = iter(streamrec.open_dataset(urls, storage_options=options))
next(it)
"""
    write_shards(urls, options)
    for pure_python in (False, True):
        run_script(body, urls, pure_python, options)
