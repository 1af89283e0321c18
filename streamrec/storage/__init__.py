"""Async object access: URL -> store; list, size, read, write (the only layer that does I/O)."""
