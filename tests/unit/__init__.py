"""Tests that need no server, subprocess or network: the format core, codecs, framing, the
writer and reader on local files and memory://, resume state, the structure rules (fast)."""
