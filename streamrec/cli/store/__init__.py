"""Subcommands about a store rather than a dataset: ``probe`` (measure it from here and
recommend settings) and ``cleanup`` (what killed writers left behind)."""
