"""GCS client behaviour: process-wide state left alone, refused connections, requester pays.

Against fake-gcs-server (the ``gcs_server`` fixture), a loopback port that refuses
connections, and a recording proxy in front of the server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import streamrec
from support.servers import FakeGcsServer

REPO = Path(streamrec.__file__).resolve().parents[1]
ZB_VARIABLE = "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"


def _shard(records: list[bytes]) -> bytes:
    with streamrec.sync.open_writer("memory://gcs-client/one.tfrecord") as writer:
        writer.write_many(records)
    import fsspec

    data: bytes = fsspec.filesystem("memory").cat_file("/gcs-client/one.tfrecord")
    return data


def _python(
    code: str, env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter with exactly ``env`` (plus this tree on the path)."""
    env = dict(env, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout
    )


# -- C.22: the library leaves the environment alone -----------------------------------------

_READ_AND_COMPARE = """
import json, os
before = dict(os.environ)
import streamrec
url, options = json.loads(os.environ["CASE"])
records = list(streamrec.open_dataset(url, storage_options=options))
changed = {k: os.environ.get(k) for k in set(before) | set(os.environ)
           if before.get(k) != os.environ.get(k)}
print(json.dumps({"records": len(records), "changed": changed}))
"""


def test_reading_a_gs_dataset_leaves_the_environment_unchanged(
    gcs_server: FakeGcsServer, gcs_bucket: str
) -> None:
    """streamrec once set GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false for the whole process (and
    every other gcsfs user in it): a library never changes global state. The read runs in a
    clean interpreter whose environment lacks the variable; a single object is read on the
    store's own requests, so gcsfs's probe (which the variable turns off) is not in its way."""
    gcs_server.put(gcs_bucket, "one.tfrecord", _shard([b"a", b"bc", b"def"]))
    url = f"gs://{gcs_bucket}/one.tfrecord"
    env = {k: v for k, v in os.environ.items() if k != ZB_VARIABLE}
    env["CASE"] = json.dumps([url, gcs_server.storage_options])
    done = _python(_READ_AND_COMPARE, env)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"records": 3, "changed": {}}
