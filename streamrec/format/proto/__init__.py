"""TensorFlow's Example protobuf messages, under the private proto package ``streamrec.tfexample``.

Wire-compatible with ``tensorflow/core/example/{example,feature}.proto`` (same messages and field
numbers), registered under other proto and file names so that importing streamrec next to
TensorFlow or the ``tfrecord`` package never hits protobuf's duplicate-symbol error.
"""

from streamrec.format.proto.example_pb2 import Example, SequenceExample
from streamrec.format.proto.feature_pb2 import (
    BytesList,
    Feature,
    FeatureList,
    FeatureLists,
    Features,
    FloatList,
    Int64List,
)

__all__ = [
    "BytesList",
    "Example",
    "Feature",
    "FeatureList",
    "FeatureLists",
    "Features",
    "FloatList",
    "Int64List",
    "SequenceExample",
]
