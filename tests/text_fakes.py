"""A fake engine for the text pipeline's tests: it "translates" by a function of the text."""

from __future__ import annotations

from typing import Callable

from xformer_cli.config import DecodeConfig
from xformer_cli.decode.engine import Engine
from xformer_cli.decode.search import Hypothesis


class _WordTokenizer:
    def encode_src(self, lines):
        return [[1] * len(line.split()) for line in lines]


class FakeEngine(Engine):
    name = "fake"

    def __init__(self, translate: Callable[[str], str] = lambda text: text.upper(), max_input_len: int = 128):
        self.tokenizer = _WordTokenizer()
        self.decode = DecodeConfig(beam_size=4, max_input_len=max_input_len)
        self.calls: list[list[str]] = []
        self.outputs: list[str] = []
        self.function = translate

    def search(self, lines, opts, wanted=None):
        self.calls.append(list(lines))
        found = []
        for index, line in enumerate(lines):
            if wanted is not None and not wanted(index):
                found.append([])
                continue
            hyps = []
            for rank in range(opts.nbest):
                self.outputs.append(self.function(line) + (f" ~{rank}" if rank else ""))
                hyps.append(Hypothesis([len(self.outputs) - 1], -float(rank), -float(rank)))
            found.append(hyps if line.strip() else [])
        return found

    def detokenize(self, hyp):
        return self.outputs[hyp.tokens[0]]
