"""Test support: the local storage servers, the fault proxy, the reference corpus and the
server fixtures (importable as ``support.*``: pyproject.toml puts tests/ on pytest's path)."""
