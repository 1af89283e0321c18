"""streamrec.storage.s3."""
