# Generated from streamrec/format/proto/example.proto by protoc (grpcio-tools, libprotoc 35.1),
# then made runtime-version agnostic by hand: the ValidateProtobufRuntimeVersion() call of new
# gencode is removed, so this module works with every protobuf runtime that has
# google.protobuf.internal.builder (3.20 and newer; streamrec declares protobuf>=4.21), on the
# upb, cpp and pure-Python backends alike. Regenerate with:
#   python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. streamrec/format/proto/*.proto
# and apply the same edit (drop the runtime_version import and check and the
# `if not _descriptor._USE_C_DESCRIPTORS:` block, whose attributes differ between runtimes;
# the pool already parses options from the serialized file).
# source: streamrec/format/proto/example.proto
"""Generated protocol buffer code (proto package ``streamrec.tfexample``)."""
from google.protobuf import descriptor_pool as _descriptor_pool
from google.protobuf import symbol_database as _symbol_database
from google.protobuf.internal import builder as _builder

_sym_db = _symbol_database.Default()

from streamrec.format.proto import feature_pb2 as _feature_pb2  # noqa: F401  (registers feature.proto first)

DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile(b'\n$streamrec/format/proto/example.proto\x12\x13streamrec.tfexample\x1a$streamrec/format/proto/feature.proto\":\n\x07\x45xample\x12/\n\x08\x66\x65\x61tures\x18\x01 \x01(\x0b\x32\x1d.streamrec.tfexample.Features\"{\n\x0fSequenceExample\x12.\n\x07\x63ontext\x18\x01 \x01(\x0b\x32\x1d.streamrec.tfexample.Features\x12\x38\n\rfeature_lists\x18\x02 \x01(\x0b\x32!.streamrec.tfexample.FeatureListsb\x06proto3')

_globals = globals()
_builder.BuildMessageAndEnumDescriptors(DESCRIPTOR, _globals)
_builder.BuildTopDescriptorsAndMessages(DESCRIPTOR, 'streamrec.format.proto.example_pb2', _globals)
