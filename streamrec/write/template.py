"""Output shard names: a url with ``{index}`` / ``{num_shards}`` fields (str.format syntax).

Parsed once, checked at open (unknown fields, a directory that varies by shard), shared by the
writer and by reshard's naming (which adds its ``{task}`` field).
"""

from __future__ import annotations

import string
from collections.abc import Callable, Sequence

__all__ = ["ShardTemplate", "parse_fields", "template_directory"]


def parse_fields(
    template: str, allowed: Sequence[str], hint: Callable[[str], str]
) -> tuple[list[tuple[str, str | None, str | None, str | None]], set[str]]:
    """The str.format parts of ``template`` and the field names it uses, all in ``allowed``
    and without conversions (else ValueError naming the field, with ``hint(name)`` saying
    which fields to use)."""
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValueError(f"{template}: not a valid shard template: {exc}") from exc
    fields: set[str] = set()
    for _, name, spec, conversion in parts:
        if name is None:
            continue
        if name not in allowed or conversion or (spec and "{" in spec):
            raise ValueError(
                f"{template}: unknown template field {{{name}}} ({hint(name)}; double literal "
                "braces: {{ }})"
            )
        fields.add(name)
    return parts, fields


def template_directory(template: str, varies: str) -> str:
    """The directory part shared by every name ``template`` makes (scheme included); a field
    in it is a ValueError ending with ``varies``."""
    scheme, rest = "", template
    if "://" in rest:
        scheme, rest = rest.split("://", 1)
        scheme += "://"
    head = rest.rsplit("/", 1)[0] if "/" in rest else ""
    if any(name is not None for _, name, _, _ in string.Formatter().parse(head)):
        raise ValueError(f"{template}: {varies}")
    return scheme + head.format() if (head or scheme) else ""


class ShardTemplate:
    """A url with ``{index}`` / ``{num_shards}`` fields (str.format syntax)."""

    FIELDS = ("index", "num_shards")

    def __init__(self, template: str, num_shards: int | None, first_index: int = 0) -> None:
        self.text = template
        self.num_shards = num_shards
        self.first_index = first_index  # the shard a writer makes first is {index} = this
        _, fields = parse_fields(
            template, self.FIELDS, lambda _: "use {index} and, with num_shards, {num_shards}"
        )
        if "num_shards" in fields and num_shards is None:
            raise ValueError(f"{template}: {{num_shards}} needs a fixed num_shards=")
        try:
            template.format(index=0, num_shards=num_shards or 1)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{template}: not a valid shard template: {exc}") from exc
        self.fields = fields

    @property
    def sharded(self) -> bool:
        return "index" in self.fields

    def url(self, index: int) -> str:
        if not self.fields:
            return self.text.format()  # "{{" -> "{"
        return self.text.format(index=self.first_index + index, num_shards=self.num_shards or 0)

    def directory(self) -> str:
        """The directory part shared by every shard (error if a field is in it)."""
        return template_directory(
            self.text,
            "the shards' directory varies by shard; pass the manifest's full url as manifest=",
        )
