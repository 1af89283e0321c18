"""The TFRecord format core: CRC, framing, codecs and Example protos.

Nothing in this package does I/O or imports asyncio or fsspec; it turns bytes into records and
back, so every storage back end and the tests can drive it the same way (sans-I/O).
"""
