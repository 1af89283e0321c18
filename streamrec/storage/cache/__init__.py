"""streamrec.storage.cache."""
