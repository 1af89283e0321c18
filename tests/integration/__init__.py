"""Tests with real servers (moto, fake-gcs-server, HTTP, the fault proxy), subprocesses, Dask,
torch DataLoader, the README and examples/, the command line, ruff and mypy."""
