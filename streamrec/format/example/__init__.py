"""TensorFlow ``Example`` / ``SequenceExample`` payloads <-> Python and numpy values.

Encoding (:func:`encode`, :func:`encode_sequence`) turns a mapping of feature values into the
serialized protobuf that TensorFlow writes for the same content (deterministic: map entries are
sorted by key), so ``tf.train.Example.FromString`` reads it back and byte comparisons with
TF-written files hold. Each value becomes one ``Feature``:

=====================================================  =====================================
value                                                  feature kind
=====================================================  =====================================
``int``, ``bool``, numpy integer / bool scalar         ``int64_list`` (one value)
``float``, numpy floating scalar                       ``float_list`` (one float32 value)
``bytes``, ``bytearray``, ``memoryview``, ``str``      ``bytes_list`` (one value; str as UTF-8)
list / tuple of one of these kinds                     that kind, one value per element
empty list / tuple                                     empty ``bytes_list``
numpy array, integer or bool dtype                     ``int64_list`` (flattened, C order)
numpy array, floating dtype                            ``float_list`` (flattened, as float32)
numpy array, ``S`` / ``U`` dtype or object of bytes    ``bytes_list`` (flattened)
=====================================================  =====================================

Anything else (``None``, dicts, nested lists, complex numbers, ...) raises :class:`TypeError`
naming the feature and the type; a list mixing kinds raises :class:`TypeError` too, and an
integer outside the int64 range :class:`ValueError`. Floats are stored as float32 (rounded to
nearest, as protobuf does; the bits of float32 arrays, NaN payloads included, are kept exactly).

Decoding without a spec (:func:`decode`, :func:`decode_sequence`) returns every feature:
``int64_list`` as an int64 array, ``float_list`` as a float32 array (bit-exact: NaN payloads
and -0.0 survive) and ``bytes_list`` as a ``list`` of ``bytes``. A ``Feature`` with no kind set
(TensorFlow's ``tf.train.Feature()``) has no values of any kind; it decodes to an *empty float32
array* (so re-encoding it writes an empty ``float_list`` rather than a kind-less Feature). With a
spec, a kind-less feature counts as present with zero values of whatever kind the spec asks for,
as in TensorFlow's ``tf.io.parse_example``.

Decoding with a spec (:func:`decode`, :func:`decode_batch`) works like ``tf.io.parse_example``:

* :class:`FixedLenFeature` ``(dtype, shape=(), default=None)``: exactly ``prod(shape)`` values,
  returned as an array of ``shape`` (``shape=()`` gives a 0-d array). A missing feature takes the
  default (a scalar is broadcast) or raises :class:`~streamrec.errors.FeatureError`. ``dtype``
  ``bytes`` gives a numpy ``object`` array of ``bytes``.
* :class:`VarLenFeature` ``(dtype)``: any number of values, a 1-d int64 / float32 array or a list
  of bytes; a missing feature gives an empty one.
* :class:`RawFeature` ``(dtype, shape)``: exactly one bytes value holding the raw array
  (``np.frombuffer(value, dtype).reshape(shape)``, as TF's ``decode_raw``); wrong byte count or
  missing feature raises :class:`~streamrec.errors.FeatureError`.

:func:`decode_batch` decodes many payloads with one spec and stacks the results: fixed-length
and raw features as ``(n, *shape)`` arrays (fixed-length ``bytes`` as an ``(n, *shape)`` object
array), variable-length features as a ``list`` of ``n`` per-record values (1-d arrays, or lists
of bytes). It uses the C accelerator ``streamrec.format._cexample`` when that extension is
built, and the pure-Python (protobuf) path otherwise; both give identical results, and the C
path hands any batch it cannot decode cleanly to the Python path, so errors are identical too.

Errors: a payload that is not a valid protobuf raises :class:`~streamrec.errors.ExampleError`
(with protobuf's ``DecodeError`` as ``__cause__``); a spec mismatch raises
:class:`~streamrec.errors.FeatureError` naming the feature, and in batches the record index.

NaN bits: with protobuf's upb (default) or C++ backend every path keeps float32 bits exactly.
protobuf's pure-Python backend turns every NaN it parses into the canonical quiet NaN (sign
and payload lost), so there the Python paths return that NaN while the C batch parser, which
reads the bytes itself, keeps the original bits; all other values are identical.

The package's modules, one job each: :mod:`~streamrec.format.example.spec` (the specs and the
Feature kinds), :mod:`~streamrec.format.example.encoding` (:func:`encode`,
:func:`encode_sequence`), :mod:`~streamrec.format.example.decoding` (:func:`decode`,
:func:`decode_sequence`), :mod:`~streamrec.format.example.batch` (:func:`decode_batch`, its
C path and fallback), :mod:`~streamrec.format.example.arrow` (its Arrow output),
:mod:`~streamrec.format.example.sequence` (:func:`decode_sequence_batch`: SequenceExamples as
Arrow) and :mod:`~streamrec.format.example.infer` (a spec from a sample). The names below
are the public API; import them from here (or from :mod:`streamrec.example`).

This package does no I/O.
"""

from streamrec.format.example.batch import decode_batch, has_c_accelerator
from streamrec.format.example.decoding import decode, decode_sequence
from streamrec.format.example.encoding import encode, encode_sequence
from streamrec.format.example.sequence import decode_sequence_batch
from streamrec.format.example.spec import (
    Decoded,
    FeatureSpec,
    FixedLenFeature,
    RawFeature,
    VarLenFeature,
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
