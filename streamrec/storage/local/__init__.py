"""streamrec.storage.local."""
