"""Writing shards: :func:`open_writer` / :class:`ShardWriter` (in :mod:`.writer`)."""

from streamrec.write.writer import ShardWriter, open_writer

__all__ = ["ShardWriter", "open_writer"]
