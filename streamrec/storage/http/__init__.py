"""streamrec.storage.http."""
