"""The one place the server touches a translation engine: load it, and call ``translate``.

Both engines (xformer's PyTorch ``Translator`` and the CTranslate2 export's
``CTranslate2Translator``) offer ``decode.engine.Engine``'s interface; the server uses only
its ``translate(lines, beam_size=...) -> list[str]`` (one output per line, blank in, blank out).
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
from xformer_cli.export.format import read_export_info
from xformer_cli.text import Glossary, TextOptions, TextResult, load_glossary, translate_texts


@dataclass
class ServedModel:
    """A loaded engine and what the server shows about it."""

    translator: Engine  # a decode engine: .translate(lines, beam_size=...), .truncated_lines
    name: str  # shown on the page and in /health
    engine: str  # xformer | ctranslate2
    precision: str
    source: str  # language codes
    target: str
    beam_size: Optional[int]  # the model's default beam, None if unknown
    threads: int = 0  # CPU threads the engine computes with

    glossary: Optional[Glossary] = None  # serve --glossary: every request's, under the request's own

    def translate(self, texts: list[str], beam_size: Optional[int] = None, format: str = "text",
                  glossary: tuple = (), alternatives: int = 0, split_sentences: bool = True,
                  wanted: Optional[Wanted] = None) -> list[TextResult]:
        """One ``TextResult`` per text: sentences split and translated in one engine call,
        HTML kept around its text, glossary terms (``glossary``: (source, target) pairs, over
        the server's) forced, and ``alternatives`` more translations from the n-best lists.
        ``wanted`` (text index -> bool): the engine drops a text whose client left."""
        terms = self.glossary or (Glossary() if glossary else None)
        if glossary:
            terms = terms.merged(Glossary.from_dict(dict(glossary)))
        opts = TextOptions(source_lang=self.source, split_sentences=split_sentences, format=format, glossary=terms,
                           alternatives=alternatives, target_lang=self.target)
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
    """Load ``model`` for serving; ``source``/``target`` override the recorded language codes;
    ``threads``: the engine's CPU threads (0: ``decode.factory.decode_threads``'s rule, with a
    core left to HTTP when ``serving``)."""
    path = Path(model)
    if not path.exists():
        raise XformerError(f"model not found: {path}")
    terms = load_glossary(glossary) if glossary is not None else None  # a bad file fails before the model loads
    # Requests choose their beam, so the engine must search as xformer does.
    translator = load_engine(path, engine, precision=precision, device=device, threads=threads, serving=serving,
                             needs=("beam_search",), log=log)
    recorded = export_languages(path) if path.is_dir() else checkpoint_languages(path)
    if recorded is None and not (source and target):
        log(f"warning: {path} records no language codes; serving en->de (set --source and --target)")
    src, tgt = recorded or ("en", "de")
    return ServedModel(
        translator=translator,
        name=name or _model_name(path),
        engine=translator.name,
        precision=translator.precision,
        source=source or src,
        target=target or tgt,
        beam_size=translator.decode.beam_size,
        threads=translator.threads,
        glossary=terms,
    )


def model_languages(path: Path) -> Optional[tuple[str, str]]:
    """The (source, target) language codes a checkpoint or an export records, or None."""
    return export_languages(path) if path.is_dir() else checkpoint_languages(path)


def checkpoint_languages(path: Path) -> Optional[tuple[str, str]]:
    """data.src_lang and data.tgt_lang of a checkpoint's config (None if it has none)."""
    import torch

    try:  # mmap: the config without reading every weight again
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - an older file format: read it whole
        from xformer_cli.checkpoint import load_checkpoint

        state = load_checkpoint(path)
    data = (state.get("config") or {}).get("data") or {}
    src, tgt = data.get("src_lang"), data.get("tgt_lang")
    return (src, tgt) if isinstance(src, str) and isinstance(tgt, str) else None


def export_languages(path: Path) -> Optional[tuple[str, str]]:
    """The language codes ``xformer export`` recorded (exports from before it did: None)."""
    info = read_export_info(path)
    src, tgt = info.get("src_lang"), info.get("tgt_lang")
    return (src, tgt) if isinstance(src, str) and isinstance(tgt, str) else None


def _model_name(path: Path) -> str:
    """``run/best.pt`` for a checkpoint, the folder's name for an export."""
    path = path.resolve()
    return path.name if path.is_dir() else f"{path.parent.name}/{path.name}"
