"""streamrec: stream TFRecord shards between training jobs and storage, without TensorFlow.

Public API (re-exports only)::

    ds = streamrec.open_dataset("data/train-*.tfrecord")
    mixed = streamrec.mix([ds_a, ds_b], weights=[0.7, 0.3], seed=0, stop="all")
    for payload in ds: ...                 # or: async for payload in ds
    records = ds.get([7, 3, 7])            # by index (every shard indexed); await ds.aget(...)
    async with streamrec.open_writer("out.tfrecord") as w:
        await w.write(payload)
    with streamrec.sync.open_writer("s3://b/out/part-{index:05d}.tfrecord",
                                    max_bytes=256 << 20) as w:   # shards + _manifest.json
        w.write(payload)
    entries = await streamrec.read_manifest("s3://b/out/_manifest.json")
    streamrec.reshard.job(["gs://a/train-*"], "s3://b/out/part-{index:05d}.tfrecord",
                      max_bytes=256 << 20)        # also: the `streamrec reshard` command
    streamrec.example.encode({...}) / decode(payload)
"""

from streamrec import errors, sync
from streamrec._version import __version__
from streamrec.manifest.core import ManifestEntry, read_manifest
from streamrec.pipeline.dataset import Dataset, open_dataset
from streamrec.pipeline.mix.mixed import MixedDataset, mix
from streamrec.pipeline.position.state import merge_states
from streamrec.reshard.job import ReshardSummary, reshard
from streamrec.write.writer import ShardWriter, open_writer

__all__ = [
    "Dataset",
    "ManifestEntry",
    "MixedDataset",
    "ReshardSummary",
    "ShardWriter",
    "__version__",
    "errors",
    "merge_states",
    "mix",
    "open_dataset",
    "open_writer",
    "read_manifest",
    "reshard",
    "sync",
]


def __getattr__(name: str) -> object:
    # streamrec.example imports protobuf; load it on first use, not on `import streamrec`.
    if name == "example":
        import importlib

        return importlib.import_module("streamrec.example")
    raise AttributeError(f"module 'streamrec' has no attribute {name!r}")
