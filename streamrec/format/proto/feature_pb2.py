# Generated from streamrec/format/proto/feature.proto by protoc (grpcio-tools, libprotoc 35.1),
# then made runtime-version agnostic by hand: the ValidateProtobufRuntimeVersion() call of new
# gencode is removed, so this module works with every protobuf runtime that has
# google.protobuf.internal.builder (3.20 and newer; streamrec declares protobuf>=4.21), on the
# upb, cpp and pure-Python backends alike. Regenerate with:
#   python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. streamrec/format/proto/*.proto
# and apply the same edit (drop the runtime_version import and check and the
# `if not _descriptor._USE_C_DESCRIPTORS:` block, whose attributes differ between runtimes;
# the pool already parses options from the serialized file).
# source: streamrec/format/proto/feature.proto
"""Generated protocol buffer code (proto package ``streamrec.tfexample``)."""
from google.protobuf import descriptor_pool as _descriptor_pool
from google.protobuf import symbol_database as _symbol_database
from google.protobuf.internal import builder as _builder

_sym_db = _symbol_database.Default()


DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile(b'\n$streamrec/format/proto/feature.proto\x12\x13streamrec.tfexample\"\x1a\n\tBytesList\x12\r\n\x05value\x18\x01 \x03(\x0c\"\x1e\n\tFloatList\x12\x11\n\x05value\x18\x01 \x03(\x02\x42\x02\x10\x01\"\x1e\n\tInt64List\x12\x11\n\x05value\x18\x01 \x03(\x03\x42\x02\x10\x01\"\xb3\x01\n\x07\x46\x65\x61ture\x12\x34\n\nbytes_list\x18\x01 \x01(\x0b\x32\x1e.streamrec.tfexample.BytesListH\x00\x12\x34\n\nfloat_list\x18\x02 \x01(\x0b\x32\x1e.streamrec.tfexample.FloatListH\x00\x12\x34\n\nint64_list\x18\x03 \x01(\x0b\x32\x1e.streamrec.tfexample.Int64ListH\x00\x42\x06\n\x04kind\"\x95\x01\n\x08\x46\x65\x61tures\x12;\n\x07\x66\x65\x61ture\x18\x01 \x03(\x0b\x32*.streamrec.tfexample.Features.FeatureEntry\x1aL\n\x0c\x46\x65\x61tureEntry\x12\x0b\n\x03key\x18\x01 \x01(\t\x12+\n\x05value\x18\x02 \x01(\x0b\x32\x1c.streamrec.tfexample.Feature:\x02\x38\x01\"<\n\x0b\x46\x65\x61tureList\x12-\n\x07\x66\x65\x61ture\x18\x01 \x03(\x0b\x32\x1c.streamrec.tfexample.Feature\"\xae\x01\n\x0c\x46\x65\x61tureLists\x12H\n\x0c\x66\x65\x61ture_list\x18\x01 \x03(\x0b\x32\x32.streamrec.tfexample.FeatureLists.FeatureListEntry\x1aT\n\x10\x46\x65\x61tureListEntry\x12\x0b\n\x03key\x18\x01 \x01(\t\x12/\n\x05value\x18\x02 \x01(\x0b\x32 .streamrec.tfexample.FeatureList:\x02\x38\x01\x62\x06proto3')

_globals = globals()
_builder.BuildMessageAndEnumDescriptors(DESCRIPTOR, _globals)
_builder.BuildTopDescriptorsAndMessages(DESCRIPTOR, 'streamrec.format.proto.feature_pb2', _globals)
