"""What text/translation.py and the HTML reader share: a segment of plain text to translate
(with positions, such as inline tags, to find again in its translation) and a rendered
translation of one."""

from __future__ import annotations

from dataclasses import dataclass, field

from xformer_cli.text.align import Position


@dataclass
class Segment:
    """Plain text to translate, and positions in it (inline tags) to find in the translation."""

    text: str
    positions: list[Position] = field(default_factory=list)
    keep_ends: bool = True  # leading and trailing whitespace kept (HTML) or dropped (a line)


@dataclass
class Rendered:
    text: str
    offsets: list[int]  # the segment's positions in ``text``
    score: float
    sentences: list[tuple[int, int, int, int]] = field(default_factory=list)  # source span -> its span in ``text``
