"""Encode and decode TensorFlow ``Example`` / ``SequenceExample`` payloads.

The public face of :mod:`streamrec.format.example` (re-exports only; see there for the value
mapping, the feature specs and the errors)::

    from streamrec import example

    payload = example.encode({"label": 3, "image": b"...", "score": [0.5, 1.5]})
    example.decode(payload)            # {"image": [b"..."], "label": array([3]), "score": ...}
    example.decode_batch(payloads, {"label": example.FixedLenFeature(np.int64)})
"""

from streamrec.format.example import (
    Decoded,
    FeatureSpec,
    FixedLenFeature,
    RawFeature,
    VarLenFeature,
    decode,
    decode_batch,
    decode_sequence,
    decode_sequence_batch,
    encode,
    encode_sequence,
    has_c_accelerator,
)

__all__ = [
    "Decoded",
    "FeatureSpec",
    "FixedLenFeature",
    "RawFeature",
    "VarLenFeature",
    "decode",
    "decode_batch",
    "decode_sequence",
    "decode_sequence_batch",
    "encode",
    "encode_sequence",
    "has_c_accelerator",
]
