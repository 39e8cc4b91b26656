"""Which direction a translation run takes: the target language asked for (needed when the
model has several), the source language given or detected, and what a model records of
its languages. ``xformer translate`` and ``eval-bleu`` decide here; ``serve`` decides per request
(``serve.protocol.check_direction``, ``serve.detect.auto_sources``).

Zero-shot (a direction the model was not trained on, e.g. de->fr for a model trained on
en<->de and en<->fr) is allowed with a warning: the tag names only the target, so the model
can be asked, and measuring how often it answers in the wrong language (eval-bleu's
off-target rate) is the point of asking. ``serve`` refuses it (an end user gets a JSON 400
naming the directions the model has).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from xformer_cli.errors import XformerError
from xformer_cli.export.format import export_languages, read_export_info
from xformer_cli.languages import Languages

DETECT_CHARS = 20000  # of the input that the source language is detected on


@dataclass(frozen=True)
class Direction:
    source: str
    target: Optional[str]  # None: a model without target languages recorded
    trained: bool = True  # False: zero-shot

    def describe(self) -> str:
        return f"{self.source}->{self.target}"


def model_languages(path: "str | Path") -> Optional[Languages]:
    """The directions a checkpoint (its config's data section) or an export directory
    (``xformer_export.json``) records; None when it records none."""
    path = Path(path)
    if path.is_dir():
        return export_languages(read_export_info(path))
    data = _checkpoint_config(path).get("data")
    if not isinstance(data, dict):
        return None
    from xformer_cli.config import config_from_dict

    try:
        return config_from_dict({"data": data}).data.languages()
    except XformerError:  # a config this xformer cannot read: its one pair, if it names one
        if data.get("pairs"):  # src_lang/tgt_lang are then defaults, not its languages: say what is wrong
            raise
        src, tgt = data.get("src_lang"), data.get("tgt_lang")
        return Languages.of([(src, tgt)]) if isinstance(src, str) and isinstance(tgt, str) else None


def _checkpoint_config(path: Path) -> dict:
    from xformer_cli.checkpoint_file import read_light

    config = read_light(path).get("config")
    return config if isinstance(config, dict) else {}


def choose_direction(languages: Languages, target: Optional[str], source: Optional[str] = None,
                     text: Callable[[], str] = lambda: "",
                     log: Callable[[str], None] = lambda message: None) -> Direction:
    """The direction to translate: ``target`` (refused when missing on a model with several,
    or one the model lacks), ``source`` as given (refused when the model does not read it),
    else the one source the model translates into ``target``, else the one py3langid finds in
    ``text()`` among those. A zero-shot direction is logged as a warning."""
    chosen = languages.target(target)
    candidates = languages.sources_into(chosen)
    if source:
        found = languages.source(source)
    elif len(candidates) == 1:
        found = candidates[0]
    else:
        found = detect_source(text(), candidates)
        log(f"source language: {found} (detected among {', '.join(candidates)}; --source-lang sets it)")
    trained = chosen is None or languages.trained(found, chosen)
    if not trained:
        log(f"warning: {found}->{chosen} is zero-shot: the model was trained on {languages.describe()}; "
            "expect some output in the wrong language (eval-bleu measures the off-target rate)")
    return Direction(found, chosen, trained)


def detect_source(text: str, candidates: Sequence[str]) -> str:
    """The candidate py3langid finds ``text`` most likely in (the first for an empty text)."""
    from xformer_cli.langid import MISSING, best_among

    if not text.strip():
        return candidates[0]
    try:
        found = best_among(text[:DETECT_CHARS], candidates)
    except XformerError:
        raise XformerError(f"the model reads {', '.join(candidates)}: give --source-lang, or install py3langid to "
                           f"detect it ({MISSING.split(': ', 1)[1]})") from None
    return found or candidates[0]
