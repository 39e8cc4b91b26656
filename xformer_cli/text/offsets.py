"""Character offsets carried through the text's edits: whitespace collapsed, terms masked
and restored, parts joined. Inline tags and missing placeholders are placed by offset."""

from __future__ import annotations

from dataclasses import dataclass, field


def normalize_with_map(text: str) -> tuple[str, list[int]]:
    """``text`` with whitespace runs collapsed to one space and the ends stripped, and for
    every offset 0..len(text) of ``text`` the matching offset of the result."""
    out: list[str] = []
    mapping: list[int] = []
    pending_space = False
    for char in text:
        if char.isspace():
            mapping.append(len(out))
            pending_space = bool(out)
            continue
        if pending_space:
            out.append(" ")
            pending_space = False
        mapping.append(len(out))
        out.append(char)
    mapping.append(len(out))
    return "".join(out), [min(m, len(out)) for m in mapping]


@dataclass
class Edits:
    """Replacements made on a text, left to right: (offset in the old text, old length, new text)."""

    items: list[tuple[int, int, str]] = field(default_factory=list)

    def add(self, at: int, old_len: int, new: str) -> None:
        self.items.append((at, old_len, new))

    def apply(self, text: str) -> str:
        out, at = [], 0
        for start, old_len, new in sorted(self.items, key=lambda item: item[0]):
            out.append(text[at:start])
            out.append(new)
            at = start + old_len
        out.append(text[at:])
        return "".join(out)

    def map(self, offset: int, side: str) -> int:
        """Where ``offset`` of the old text is in the new one; inside a replaced span: at the
        new text's start (``start``) or end (``end``)."""
        shift = 0
        for start, old_len, new in sorted(self.items, key=lambda item: item[0]):
            end = start + old_len
            if end < offset or (end == offset and (old_len or side == "end")):
                shift += len(new) - old_len
            elif start < offset < end:
                return start + shift + (len(new) if side == "end" else 0)
        return offset + shift
