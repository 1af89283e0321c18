"""streamrec.storage.gcs."""
