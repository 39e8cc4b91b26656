"""The interface every translation engine offers, and what is built on it alone.

Two engines: ``Translator`` (this package's PyTorch model, ``decode/translator.py``) and
``CTranslate2Translator`` (a model written by ``xformer export``, ``decode/ct2_engine.py``).
Both take the same ``SearchOptions`` and give the same ``Hypothesis`` lists, so the CLI,
evaluation and serving never ask which one they hold. ``decode/factory.py`` builds them:

    engine = load_engine(["runs/multi30k/best.pt"])   # decode.factory.load_engine
    opts = engine.options(beam_size=5)          # the checkpoint's defaults, checked
    engine.search(lines, opts)                  # n-best hypotheses per line
    engine.translate(lines, beam_size=5)        # one string per line
"""

from __future__ import annotations

import warnings
from typing import Any, Optional, Sequence

from xformer_cli.config import Config, DecodeConfig
from xformer_cli.decode.inputs import DEFAULT_MAX_INPUT_LEN, SourceTag
from xformer_cli.decode.options import SearchOptions, resolve_options
from xformer_cli.decode.search import Hypothesis, Wanted
from xformer_cli.errors import XformerError
from xformer_cli.languages import Languages
from xformer_cli.tokenizer import Tokenizer


def option_name(field: str) -> str:
    """The command-line option that moves a ``SearchOptions`` field from its default."""
    return "--no-cache" if field == "use_cache" else "--" + field.replace("_", "-")


class Engine:
    """Subclasses set ``tokenizer``, ``decode`` and ``truncated_lines`` (input lines cut to
    ``max_input_len`` over the engine's life) and implement ``search``; ``unsupported``
    lists the ``SearchOptions`` fields they cannot honour when not at their defaults."""

    name = "engine"
    tokenizer: Tokenizer
    decode: DecodeConfig
    truncated_lines: int = 0
    threads: int = 0  # CPU threads it computes with (set by decode.factory.load_engine; 0: not set)
    unsupported: tuple[str, ...] = ()
    # The directions the model translates and its tags, read with the model (None: not known, e.g.
    # an old export; its lines then bring their own tags). The CLI and text/translation.py ask here
    # rather than read the model's file again.
    languages: Optional[Languages] = None
    # The training config of the checkpoint it was built from (eval-bleu reads its test sets
    # here); None for an export directory or a model in memory.
    config: Optional[Config] = None

    def options(self, **given: Any) -> SearchOptions:
        """Search options: the given ones (None = unset), the rest from the model's decode
        defaults; checked, and refused when this engine cannot honour them. ``target_lang``
        becomes the model's code for it (fra -> fr), refused when the model lacks it; with no
        length_penalty given, the target's own alpha (decode.length_penalty_by_target) applies."""
        opts = resolve_options(self.decode, **given)
        default = SearchOptions()
        for name in self.unsupported:
            if getattr(opts, name) != getattr(default, name):
                raise XformerError(f"the {self.name} engine does not support {option_name(name)}")
        if opts.target_lang is not None and self.languages is not None:
            opts.target_lang = self.languages.target(opts.target_lang, "target_lang")
        opts.length_penalty_given = given.get("length_penalty") is not None
        if not opts.length_penalty_given and opts.target_lang in opts.length_penalty_by_target:
            opts.length_penalty = opts.length_penalty_by_target[opts.target_lang]  # the target's own alpha
        return opts

    def source_tag(self, opts: SearchOptions) -> SourceTag:
        """What leads the source lines: the tag of ``opts.target_lang`` (or of the model's one
        target); on a model with several targets and none asked for, each line's own tag."""
        languages = self.languages
        if languages is None or not languages.tagged:
            return SourceTag()
        targets = languages.targets
        target = opts.target_lang or (targets[0] if len(targets) == 1 else None)
        if target is None:
            return SourceTag(missing=f"this model translates into {', '.join(targets)}: give target_lang "
                                     "(--target-lang), or start every line with its tag (>>xxx<<)")
        return SourceTag(languages.tag(target))

    def search(self, lines: Sequence[str], opts: SearchOptions,
               wanted: Optional[Wanted] = None) -> list[list[Hypothesis]]:
        """The ``opts.nbest`` best hypotheses per line, best first; [] for a blank line.
        ``wanted`` (line index -> still wanted?) is asked as the search goes: a line that
        is no longer wanted (its client went away) is dropped as soon as the engine can,
        and gets []."""
        raise NotImplementedError

    def detokenize(self, hyp: Hypothesis) -> str:
        return self.tokenizer.decode_tgt([hyp.tokens])[0]

    def input_limit(self, asked: Optional[int] = None) -> int:
        """The source pieces a line keeps (``asked``, else decode.max_input_len, else the default):
        what every message about cut lines names."""
        return asked or self.options().max_input_len or DEFAULT_MAX_INPUT_LEN

    def translate(
        self,
        lines: Sequence[str],
        beam_size: Optional[int] = None,
        length_penalty: Optional[float] = None,
        max_len_a: Optional[float] = None,
        max_len_b: Optional[int] = None,
        batch_size: Optional[int] = None,
        target_lang: Optional[str] = None,
        **more: Any,
    ) -> list[str]:
        """One output line per input line, in input order; blank input gives blank output.
        Each line is one input to the model as it is: no sentence splitting, and a line past
        ``decode.max_input_len`` pieces is cut (a warning says so). What ``xformer translate``
        writes (sentences, long lines in pieces, glossary, numbers) is
        ``xformer_cli.text.translate_texts``. ``target_lang``: a multilingual model's target
        language (fr; needed when it has several). ``more``: any other ``SearchOptions`` field
        (sampling_topk, temperature, ...)."""
        opts = self.options(beam_size=beam_size, length_penalty=length_penalty, max_len_a=max_len_a,
                            max_len_b=max_len_b, batch_size=batch_size, target_lang=target_lang, **more)
        cut_before = self.truncated_lines
        out = self.translate_lines(lines, opts)
        if self.truncated_lines > cut_before:
            limit = self.input_limit(opts.max_input_len)
            warnings.warn(f"{self.truncated_lines - cut_before} line(s) longer than {limit} pieces were cut to it; "
                          "xformer_cli.text.translate_texts translates them whole, by sentences, as xformer translate "
                          "does", stacklevel=2)
        return out

    def translate_lines(self, lines: Sequence[str], opts: SearchOptions) -> list[str]:
        """``translate`` with options made already, and no warning: for callers that count
        ``truncated_lines`` themselves and say it in their own log (validation, the pipeline)."""
        return [self.detokenize(hyps[0]) if hyps else "" for hyps in self.search(lines, opts)]
