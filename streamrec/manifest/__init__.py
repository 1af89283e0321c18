"""Manifests: the list of a written dataset's shards, written last by writers.

:mod:`.core` reads and writes the document (names relative to its own directory);
:mod:`.check` turns a manifest into shards to read, checked against what is stored.
"""

from streamrec.manifest.core import MANIFEST_NAME, Manifest, ManifestEntry, read_manifest

__all__ = ["MANIFEST_NAME", "Manifest", "ManifestEntry", "read_manifest"]
