"""Source lines to batches of piece ids: what every engine does before it searches."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Optional, Sequence

from xformer_cli.data.batching import token_batches
from xformer_cli.decode.options import SearchOptions
from xformer_cli.errors import XformerError
from xformer_cli.tokenizer import Tokenizer

DEFAULT_MAX_INPUT_LEN = 1024  # CTranslate2's default, for decode settings that give none


def normalize_line(line: str) -> str:
    """Whitespace (line breaks of every kind included) collapsed to single spaces, so one
    input line stays one output line."""
    return " ".join(line.split())


@dataclass(frozen=True)
class SourceTag:
    """What leads a multilingual model's source lines: ``tag`` (the target language's; a line
    that starts with a tag of its own keeps it), or, with none, each line's own tag; a line
    without one is then refused with ``missing``."""

    tag: Optional[str] = None
    missing: str = ""  # the error for an untagged line ("" : the model needs no tag)


def checked_lines(lines: Iterable[str], what: str = "lines") -> list[str]:
    """``lines`` as a list of strings, or one line naming what a Python caller gave instead: a
    single string was translated a character a line, and a generator was read up before the
    results were laid out for it."""
    if isinstance(lines, (str, bytes)):
        raise XformerError(f"{what}: give a list of strings, not one {type(lines).__name__}")
    try:
        lines = list(lines)
    except TypeError:
        raise XformerError(f"{what}: give a list of strings, not {type(lines).__name__}") from None
    for index, line in enumerate(lines):
        if not isinstance(line, str):
            raise XformerError(f"{what}[{index}] is {type(line).__name__}, not a string")
    return lines


def encode_lines(tokenizer: Tokenizer, lines: Sequence[str], max_input_len: int,
                 lead: SourceTag = SourceTag()) -> tuple[list[list[int]], int]:
    """Source piece ids per line (led by ``lead.tag``'s id), cut to ``max_input_len`` (0: the
    default); and how many were cut."""
    limit = max_input_len or DEFAULT_MAX_INPUT_LEN
    encoded = tokenizer.encode_src([normalize_line(line) for line in lines])
    tags = set(tokenizer.src_tags.values())
    if lead.tag is not None:  # a line that starts with a tag of its own keeps it
        tag = tokenizer.tag_id(lead.tag)
        encoded = [[tag] + ids if ids and ids[0] not in tags else ids for ids in encoded]
    elif lead.missing and any(ids and ids[0] not in tags for ids in encoded):
        raise XformerError(lead.missing)
    cut = sum(len(ids) > limit for ids in encoded)
    if cut:
        encoded = [ids[:limit] for ids in encoded]
    return encoded, cut


def source_batches(tokenizer: Tokenizer, lines: Sequence[str], opts: SearchOptions,
                   lead: SourceTag = SourceTag()) -> tuple[list[list[int]], list[list[int]], int]:
    """Encoded source lines, batches of their indices, and how many lines were cut.

    Lines longer than ``opts.max_input_len`` pieces are cut to it: one garbage line (a
    5000-word paste, 3000 repeated characters) then costs what a long normal line costs,
    and its output, at most max_len_a * max_input_len + max_len_b pieces, is bounded too.
    Blank lines are left out; batches are sorted by length and capped by
    ``opts.batch_size`` sentences and ``opts.max_tokens`` slots x beam."""
    encoded, cut = encode_lines(tokenizer, lines, opts.max_input_len, lead)
    lengths = [len(ids) for ids in encoded]
    order = sorted((i for i, n in enumerate(lengths) if n), key=lambda i: lengths[i])
    return encoded, token_batches(lengths, order, opts.batch_size, max(opts.max_tokens // opts.beam_size, 1)), cut


def still_wanted(batches: Iterable[list[int]], wanted: Optional[Callable[[int], bool]]) -> Iterator[list[int]]:
    """The batches (line indices) without the lines no longer ``wanted``, asked as each batch
    is reached (a client may leave while the earlier ones decode); a batch left empty is skipped."""
    for batch in batches:
        batch = batch if wanted is None else [i for i in batch if wanted(i)]
        if batch:
            yield batch


def chunked(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    """Consecutive lists of at most ``size`` lines: what streaming translation holds at once."""
    chunk: list[str] = []
    for line in lines:
        chunk.append(line)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
