"""A unit's source as the engine reads it once glossary terms or numbers are masked: shared by
the glossary (which makes it) and the number check (which reads it)."""

from __future__ import annotations

from dataclasses import dataclass

from xformer_cli.text.offsets import Edits


@dataclass
class Masked:
    """A unit's source with its terms replaced by placeholders."""

    text: str  # what the engine translates
    targets: list[str]  # placeholder i+1 -> the text it stands for in the output
    spans: list[tuple[int, int]]  # placeholder i+1's span in ``text``
    edits: "Edits"  # the unmasked text -> ``text``
    placeholders: bool = True  # False: the terms were left in ``text``; ``spans`` are theirs
    languages: tuple[str, str] = ("en", "")  # source, target ("": any): how numbers read
