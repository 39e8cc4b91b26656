"""The one place the server touches a translation engine: load it, and translate through
``text.translate_texts`` (the text options, glossary and HTML of ``xformer translate``).

Both engines (xformer's PyTorch ``Translator`` and the CTranslate2 export's
``CTranslate2Translator``) offer ``decode.engine.Engine``'s interface; the server reaches it
only through ``translate_texts`` (``search``, ``options``, ``detokenize``, ``alignment_weights``).
``decode.factory.load_engine`` builds the engine, as it does for ``xformer translate``:
``-m`` is a checkpoint or a directory written by ``xformer export``, and ``engine``,
``precision`` and ``device`` mean what they mean there.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from xformer_cli.decode.engine import Engine
from xformer_cli.decode.factory import load_engine
from xformer_cli.decode.search import Wanted
from xformer_cli.errors import XformerError
from xformer_cli.languages import Languages, same_language
from xformer_cli.text import Glossary, TextOptions, TextResult, load_glossary, translate_texts


@dataclass
class ServedModel:
    """A loaded engine and what the server shows about it."""

    translator: Engine  # a decode engine, driven by text.translate_texts; .truncated_lines
    name: str  # shown on the page and in /health
    engine: str  # xformer | ctranslate2
    precision: str
    source: str  # language codes
    target: str
    beam_size: Optional[int]  # the model's default beam, None if unknown
    threads: int = 0  # CPU threads the engine computes with

    glossary: Optional[Glossary] = None  # serve --glossary: every request's, under the request's own
    languages: Optional[Languages] = None  # every direction (source and target: the page's first)

    def translate(self, texts: list[str], beam_size: Optional[int] = None, format: str = "text",
                  glossary: tuple = (), alternatives: int = 0, split_sentences: bool = True,
                  wanted: Optional[Wanted] = None, target: Optional[str] = None,
                  source: Optional[str] = None) -> list[TextResult]:
        """One ``TextResult`` per text: sentences split and translated in one engine call,
        HTML kept around its text, glossary terms (``glossary``: (source, target) pairs, over
        the server's) forced, and ``alternatives`` more translations from the n-best lists.
        ``wanted`` (text index -> bool): the engine drops a text whose client left. A
        multilingual model's ``target`` picks its tag; ``source``, the sentence rules."""
        terms = self.glossary or (Glossary() if glossary else None)
        if glossary:
            terms = terms.merged(Glossary.from_dict(dict(glossary)))
        opts = TextOptions(source_lang=source or self.source, split_sentences=split_sentences, format=format,
                           glossary=terms, alternatives=alternatives, target_lang=target)
        beam = max(beam_size or self.beam_size or 1, alternatives + 1)
        return translate_texts(self.translator, texts, opts, self.translator.options(beam_size=beam), wanted)

    @property
    def truncated_lines(self) -> int:
        return getattr(self.translator, "truncated_lines", 0)


def load_served_model(
    model: "str | Path",
    engine: str = "auto",
    device: str = "auto",
    precision: str = "auto",
    source: Optional[str] = None,
    target: Optional[str] = None,
    name: Optional[str] = None,
    threads: int = 0,
    serving: bool = False,
    log: Callable[[str], None] = lambda message: None,
    glossary: Optional["str | Path"] = None,
) -> ServedModel:
    """Load ``model`` for serving; ``source``/``target``: see ``served_languages``;
    ``threads``: the engine's CPU threads (0: ``decode.factory.decode_threads``'s rule, with a
    core left to HTTP when ``serving``)."""
    path = Path(model)
    if not path.exists():
        raise XformerError(f"model not found: {path}")
    terms = load_glossary(glossary) if glossary is not None else None  # a bad file fails before the model loads
    # Requests choose their beam, so the engine must search as xformer does.
    translator = load_engine(path, engine, precision=precision, device=device, threads=threads, serving=serving,
                             needs=("beam_search",), log=log)
    languages = served_languages(translator.languages, source, target, log, path)  # read with the model
    first_source, first_target = languages.pairs[0]
    if len(languages.pairs) > 1:  # --source / --target: the page's first direction, one the model has
        first_target = languages.target(target, "--target") if target else first_target
        first_source = languages.source(source, "--source") if source else languages.sources_into(first_target)[0]
    return ServedModel(
        translator=translator,
        name=name or _model_name(path),
        engine=translator.name,
        precision=translator.precision,
        source=first_source,
        target=first_target,
        beam_size=translator.decode.beam_size,
        threads=translator.threads,
        glossary=terms,
        languages=languages,
    )


def served_languages(recorded: Optional[Languages], source: Optional[str], target: Optional[str],
                     log: Callable[[str], None], path: Path) -> Languages:
    """The directions to serve: a bilingual model's one pair, a multilingual model's every one
    (--source and --target pick the page's first). On a bilingual model --source and --target name
    the languages where the model records none and may respell recorded ones (de-DE for de, deu);
    one that names another language is refused: the model would serve under a false label."""
    if recorded is not None and len(recorded.pairs) > 1:
        return recorded
    if recorded is None:
        if not (source and target):
            log(f"warning: {path} records no language codes; serving en->de (set --source and --target)")
        return Languages(((source or "en", target or "de"),), ())
    src, tgt = recorded.pairs[0]
    for flag, given, known in (("--source", source, src), ("--target", target, tgt)):
        if given and not _same_language_or_region(given, known):
            raise XformerError(f"{flag} {given}: {path} translates {recorded.describe()} only "
                               f"(--source and --target respell its languages, they cannot change them)")
    tags = ((target or tgt, recorded.tags[0][1]),) if recorded.tagged else ()
    return Languages(((source or src, target or tgt),), tags)


def _same_language_or_region(given: str, known: str) -> bool:
    """fr and fra name one language, and so do de-DE and de (a region or script subtag's variant)."""
    primary = [code.replace("_", "-").split("-")[0] for code in (given, known)]
    return same_language(given, known) or same_language(*primary)


def _model_name(path: Path) -> str:
    """``run/best.pt`` for a checkpoint, the folder's name for an export."""
    path = path.resolve()
    return path.name if path.is_dir() else f"{path.parent.name}/{path.name}"
