"""Language codes, target-language tags and the directions a model translates.

A multilingual model reads the target language as its first source token, in the OPUS-MT
convention: ``>>deu<<``, ``>>fra<<``, ``>>ces<<`` (ISO 639-3), one piece of the vocabulary
each. The tag text leads the source line (``">>fra<< A man rides a bike."``); the tokenizer
splits it off before sentencepiece, as ``MarianTokenizer`` does, so an exported model reads
the same ids in transformers and an imported OPUS-MT model reads its own tags.

Codes are the ones the data files carry (``train.de``): ISO 639-1 where there is one. The
tag of a code is ``>>`` + its ISO 639-3 code + ``<<``; a code already of three letters (with
an optional script, ``cmn_Hans``) is its own; any other needs ``data.lang_tags``.

    langs = Languages.of([("en", "de"), ("en", "fr")], tagged=True)
    langs.tag("fr")                 # ">>fra<<"
    langs.target("fra")             # "fr": the model's own code for it
    langs.target(None)              # XformerError: translates into de, fr; say which
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Sequence

from xformer_cli.errors import XformerError

# ISO 639-1 -> ISO 639-3 (the terminological code, as OPUS-MT's tags use it)
ISO_639_3 = {
    "af": "afr", "am": "amh", "ar": "ara", "az": "aze", "be": "bel", "bg": "bul", "bn": "ben", "bs": "bos",
    "ca": "cat", "cs": "ces", "cy": "cym", "da": "dan", "de": "deu", "el": "ell", "en": "eng", "eo": "epo",
    "es": "spa", "et": "est", "eu": "eus", "fa": "fas", "fi": "fin", "fr": "fra", "ga": "gle", "gd": "gla",
    "gl": "glg", "gu": "guj", "he": "heb", "hi": "hin", "hr": "hrv", "hu": "hun", "hy": "hye", "id": "ind",
    "is": "isl", "it": "ita", "ja": "jpn", "ka": "kat", "kk": "kaz", "km": "khm", "kn": "kan", "ko": "kor",
    "ky": "kir", "la": "lat", "lb": "ltz", "lt": "lit", "lv": "lav", "mk": "mkd", "ml": "mal", "mn": "mon",
    "mr": "mar", "ms": "msa", "mt": "mlt", "my": "mya", "nb": "nob", "ne": "nep", "nl": "nld", "nn": "nno",
    "no": "nor", "pa": "pan", "pl": "pol", "ps": "pus", "pt": "por", "ro": "ron", "ru": "rus", "si": "sin",
    "sk": "slk", "sl": "slv", "sq": "sqi", "sr": "srp", "sv": "swe", "sw": "swa", "ta": "tam", "te": "tel",
    "tg": "tgk", "th": "tha", "tl": "tgl", "tr": "tur", "uk": "ukr", "ur": "urd", "uz": "uzb", "vi": "vie",
    "xh": "xho", "yi": "yid", "zh": "zho", "zu": "zul",
}
_ISO_639_1 = {three: two for two, three in ISO_639_3.items()}
_THREE_LETTERS = re.compile(r"[a-z]{3}(_[A-Z][a-z]{3})?")  # deu, cmn_Hans
TAG = re.compile(r">>[^\s<>]+<<")  # a target-language tag as the vocabulary holds it


def is_tag(piece: str) -> bool:
    return TAG.fullmatch(piece) is not None


def tag_for(code: str, overrides: Optional[Mapping[str, str]] = None) -> str:
    """The tag of language ``code`` (``overrides``: data.lang_tags); an unknown code is an error."""
    if overrides and code in overrides:
        tag = overrides[code]
        if not is_tag(tag):
            raise XformerError(f"tag {tag!r} of {code!r} must look like >>xxx<< (no spaces, '<' or '>' inside)")
        return tag
    three = ISO_639_3.get(code.lower())
    if three is None and _THREE_LETTERS.fullmatch(code):
        three = code
    if three is None:
        raise XformerError(f"unknown language code {code!r}: give an ISO 639-1 code xformer knows (de, fr, cs, ...), "
                           f"an ISO 639-3 code (deu), or its tag in data.lang_tags ({code}: '>>xxx<<')")
    return f">>{three}<<"


def code_of_tag(tag: str) -> str:
    """The language code a tag names: ISO 639-1 where xformer knows one (``>>fra<<`` -> fr), else
    the tag's own code (``>>cmn_Hans<<`` -> cmn_Hans)."""
    inner = tag[2:-2]
    return _ISO_639_1.get(inner, inner)


def plain_code(code: str) -> str:
    """One spelling of a language: its ISO 639-1 code where xformer knows one (fr for fr, fra,
    FRA, >>fra<<), else the code as given."""
    three = _three(code)
    return _ISO_639_1.get(three, code) if three is not None else code


def same_language(a: str, b: str) -> bool:
    """Two codes of one language: equal, or the same ISO 639-3 code (fr and fra)."""
    if a.lower() == b.lower():
        return True
    return _three(a) is not None and _three(a) == _three(b)


def _three(code: str) -> Optional[str]:
    code = code[2:-2] if is_tag(code) else code
    three = code.lower() if "_" not in code else code  # FRA is fra; cmn_Hans keeps its script's case
    return ISO_639_3.get(code.lower(), three if _THREE_LETTERS.fullmatch(three) else None)


_REGION = re.compile(r"([A-Za-z]{2,3})[-_]([A-Za-z]{2}|[0-9]{3})")  # fr-FR, pt_BR, es-419: a region, not a script


def without_region(code: str) -> str:
    """``code`` less a region subtag (fr-FR -> fr); a script (zh-Hant, cmn_Hans) stays."""
    found = _REGION.fullmatch(code)
    return found.group(1) if found else code


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


@dataclass(frozen=True)
class Languages:
    """The directions a model translates (source, target), in its config's order, and the tag
    of each target language when the model reads tags (``tags`` empty: it reads none)."""

    pairs: tuple[tuple[str, str], ...]
    tags: tuple[tuple[str, str], ...] = ()  # (target code, tag)

    @classmethod
    def of(cls, pairs: Sequence[tuple[str, str]], tagged: bool = False,
           overrides: Optional[Mapping[str, str]] = None) -> "Languages":
        pairs = tuple((str(s), str(t)) for s, t in pairs)
        targets = _unique(t for _, t in pairs)
        return cls(pairs, tuple((t, tag_for(t, overrides)) for t in targets) if tagged else ())

    @property
    def sources(self) -> list[str]:
        return _unique(s for s, _ in self.pairs)

    @property
    def targets(self) -> list[str]:
        return _unique(t for _, t in self.pairs)

    @property
    def codes(self) -> list[str]:
        """Every language the model reads or writes, sources first."""
        return _unique([*self.sources, *self.targets])

    @property
    def tagged(self) -> bool:
        return bool(self.tags)

    def tag(self, target: Optional[str]) -> Optional[str]:
        """The tag that asks for ``target`` (a code of the model's), None on a model without tags."""
        return dict(self.tags).get(target) if target is not None else None

    def describe(self) -> str:
        return ", ".join(f"{s}->{t}" for s, t in self.pairs)

    def find(self, code: str, among: Sequence[str]) -> Optional[str]:
        """The code of ``among`` that names the language ``code`` names (fr, fra, FRA or >>fra<<; or
        fr-FR, a regional variant, where no code of among names the region itself)."""
        for asked in dict.fromkeys((code, without_region(code))):
            found = next((known for known in among if same_language(asked, known)), None)
            if found is not None:
                return found
        return None

    def target(self, requested: Optional[str], flag: str = "--target-lang") -> Optional[str]:
        """The model's code for the requested target language; None when none was asked for
        and the model has one target. Refused in one line: no target on a model with several,
        or one the model does not translate into."""
        targets = self.targets
        if requested is None or requested == "":
            if len(targets) > 1:
                raise XformerError(f"this model translates into {', '.join(targets)}: say which with {flag} "
                                   f"({flag} {targets[0]})")
            return targets[0] if targets else None
        found = self.find(requested, targets)
        if found is None:
            if len(self.pairs) == 1:
                raise XformerError(f"{flag} {requested}: this model translates {self.describe()} only")
            raise XformerError(f"{flag} {requested}: this model translates into {', '.join(targets)} only")
        return found

    def source(self, requested: str, flag: str = "--source-lang") -> str:
        """The model's code for a source language it reads; refused when it reads no such language."""
        found = self.find(requested, self.sources)
        if found is None:
            raise XformerError(f"{flag} {requested}: this model reads {', '.join(self.sources)} only")
        return found

    def sources_into(self, target: Optional[str]) -> list[str]:
        """The source languages the model was trained to translate into ``target``."""
        return _unique(s for s, t in self.pairs if target is None or t == target)

    def trained(self, source: str, target: str) -> bool:
        return (source, target) in self.pairs

    def to_dict(self) -> dict:
        return {"pairs": [list(p) for p in self.pairs], "tags": dict(self.tags)}

    @classmethod
    def from_dict(cls, value: Mapping) -> "Languages":
        pairs = tuple((str(s), str(t)) for s, t in value.get("pairs", []))
        tags = value.get("tags") or {}
        return cls(pairs, tuple((t, tags[t]) for t in _unique(t for _, t in pairs) if t in tags))
