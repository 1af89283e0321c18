"""streamrec.storage.azure."""
