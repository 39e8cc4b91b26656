"""HTML in, HTML out: text translated, markup kept byte for byte.

``html.parser`` tokenizes (it never raises on broken HTML); every token keeps its raw source
text. Block-level tags split the page into blocks; a block's text nodes and entities, with
the inline tags between them (``<b>``, ``<a href>``, ``<i>`` ...), make one segment, whose
inline tags are carried to the translation as positions (``align.py``), in their source
order, so the tag sequence is the input's and the output is well-formed wherever the input
is. The contents of ``<script>``, ``<style>``, ``<code>``, ``<pre>`` and ``<textarea>``,
comments, doctypes and whitespace-only text are copied as they are.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser

from xformer_cli.text.segments import Rendered, Segment

INLINE = frozenset("a abbr b bdi bdo br cite data dfn em font i img kbd mark q s samp small span strong sub sup "
                   "time u var wbr".split())
VOID = frozenset("area base br col embed hr img input link meta param source track wbr".split())
ENTITY = re.compile(r"&#?\w+;")
KEEP = frozenset("script style code pre textarea".split())
UNFINISHED = re.compile(r"<(?:!|\?|/?[A-Za-z])")  # what html.parser hands back as text when the input ends inside it


@dataclass
class Token:
    kind: str  # text | start | end | other
    raw: str
    tag: str = ""


class _Tokenizer(HTMLParser):
    def __init__(self, source: str):
        super().__init__(convert_charrefs=False)
        self.source = source
        self.line_starts = [0] + [i + 1 for i, char in enumerate(source) if char == "\n"]
        self.starts: list[tuple[int, str, str]] = []  # (offset, kind, tag)

    def _mark(self, kind: str, tag: str = "") -> None:
        line, column = self.getpos()
        self.starts.append((self.line_starts[line - 1] + column, kind, tag))

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._mark("start", tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._mark("void", tag)

    def handle_endtag(self, tag: str) -> None:
        self._mark("end", tag)

    def handle_data(self, data: str) -> None:
        self._mark("text")

    def handle_entityref(self, name: str) -> None:
        self._mark("text")

    def handle_charref(self, name: str) -> None:
        self._mark("text")

    def handle_comment(self, data: str) -> None:
        self._mark("other")

    def handle_decl(self, decl: str) -> None:
        self._mark("other")

    def handle_pi(self, data: str) -> None:
        self._mark("other")

    def unknown_decl(self, data: str) -> None:
        self._mark("other")


def _unfinished_tail(source: str, marks: list) -> list:
    """Markup the input ends inside (``<!-- note``, ``<a href="x``), which html.parser hands back
    as text, is kept as it is: a browser shows none of it, so it is not text to translate."""
    cut = None
    for i in range(len(marks) - 1, -1, -1):  # the trailing run of text, from its end
        if marks[i][1] != "text":
            break
        if UNFINISHED.match(source, marks[i][0]):
            cut = i
    return marks if cut is None else marks[:cut] + [(marks[cut][0], "other", "")]


def tokenize(source: str) -> list[Token]:
    """Tokens whose raw texts join to ``source`` exactly; text runs merged."""
    parser = _Tokenizer(source)
    try:
        parser.feed(source)
        if parser.rawdata:  # the input ends inside markup: what is left is handed back as text here, at
            # once (close() would walk it a character at a time, quadratic in html.parser before CPython's
            # fix: "<a " 16,000 times took seconds); _unfinished_tail keeps it as markup
            parser.starts.append((len(source) - len(parser.rawdata), "text", ""))
            parser.rawdata = ""
        parser.close()
    except Exception:  # noqa: BLE001 - html.parser should not raise; if it does, what is left is text
        pass
    marks = sorted({offset: (offset, kind, tag) for offset, kind, tag in parser.starts}.values())
    if not marks or marks[0][0] > 0:
        marks.insert(0, (0, "text", ""))
    marks = _unfinished_tail(source, marks)
    tokens: list[Token] = []
    for (offset, kind, tag), following in zip(marks, [m[0] for m in marks[1:]] + [len(source)]):
        raw = source[offset:following]
        if not raw:
            continue
        if kind == "void" or (kind == "start" and tag in VOID):
            kind = "void"
        if kind == "text" and tokens and tokens[-1].kind == "text":
            tokens[-1].raw += raw
        else:
            tokens.append(Token(kind, raw, tag))
    return tokens


@dataclass
class Block:
    """Text and inline tags between two block boundaries."""

    tokens: list[Token]
    segment: Segment = field(default_factory=lambda: Segment(""))
    tags: list[Token] = field(default_factory=list)  # the inline tags, in order, at segment.positions
    entities: dict[str, str] = field(default_factory=dict)  # character -> the entity the source wrote it as

    def build(self) -> "Block":
        text: list[str] = []
        at = 0
        for token in self.tokens:
            if token.kind == "text":
                plain = html.unescape(token.raw)
                for entity in ENTITY.findall(token.raw):
                    char = html.unescape(entity)
                    if len(char) == 1 and char not in "&<>":
                        self.entities[char] = entity
                text.append(plain)
                at += len(plain)
            else:
                self.tags.append(token)
                self.segment.positions.append((at, "end" if token.kind == "end" else "start"))
        self.segment.text = "".join(text)
        return self

    def render(self, rendered: Rendered) -> str:
        out: list[str] = []
        at = floor = 0
        for tag, offset in zip(self.tags, rendered.offsets):
            offset = min(max(offset, floor), len(rendered.text))  # source order: the tag sequence stays
            out.append(self._escape(rendered.text[at:offset]))
            out.append(tag.raw)
            at = floor = offset
        out.append(self._escape(rendered.text[at:]))
        return "".join(out)

    def _escape(self, text: str) -> str:
        return "".join(self.entities.get(char) or html.escape(char, quote=False) for char in text)


@dataclass
class Document:
    parts: list["str | Block"]

    @property
    def segments(self) -> list[Segment]:
        return [part.segment for part in self.parts if isinstance(part, Block)]

    def render(self, rendered: list[Rendered]) -> str:
        outputs = iter(rendered)
        return "".join(part if isinstance(part, str) else part.render(next(outputs)) for part in self.parts)


def _is_boundary(token: Token) -> bool:
    """A token that ends the block before it (``parse_html`` flushes there)."""
    return token.kind == "other" or (token.kind != "text" and token.tag not in INLINE)


def split_html(source: str, max_chars: int) -> list[str]:
    """``source`` in pieces of about ``max_chars`` characters whose ``parse_html`` parts, one piece
    after the other, are the whole page's: cut only after a block boundary, outside script, style,
    code, pre and textarea (a block longer than ``max_chars`` stays whole). A long page is then
    translated piece by piece, taking turns with other requests."""
    pieces: list[str] = []
    start = at = kept = 0
    for token in tokenize(source):
        if token.tag in KEEP and token.kind in ("start", "end"):
            kept = kept + 1 if token.kind == "start" else max(kept - 1, 0)
        at += len(token.raw)
        if at - start >= max_chars and not kept and _is_boundary(token):
            pieces.append(source[start:at])
            start = at
    return pieces + ([source[start:]] if start < len(source) or not pieces else [])


def parse_html(source: str) -> Document:
    """The page as raw markup and translatable blocks."""
    parts: list[str | Block] = []
    block: list[Token] = []
    kept = 0  # depth inside script, style, code, pre, textarea

    def flush():
        if block:
            if any(t.kind == "text" for t in block) and "".join(t.raw for t in block if t.kind == "text").strip():
                parts.append(Block(list(block)).build())
            else:
                parts.append("".join(t.raw for t in block))
            block.clear()

    for token in tokenize(source):
        if token.tag in KEEP and token.kind in ("start", "end"):
            kept = kept + 1 if token.kind == "start" else max(kept - 1, 0)
            flush()
            parts.append(token.raw)
        elif kept or _is_boundary(token):
            flush()
            parts.append(token.raw)
        else:
            block.append(token)
    flush()
    return Document(parts)
