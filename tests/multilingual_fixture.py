"""Small multi-parallel corpora and tiny multilingual checkpoints for the multilingual tests:
synthetic words, one line per sentence in every language (as Multi30k's train.{en,de,fr,cs}),
so the unit tier reads no corpus."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Optional

import pytest
import torch

WORDS = {
    "en": "a man woman dog child is are rides runs sits on in the with red blue ball street park water bike".split(),
    "de": "ein mann frau hund kind ist sind fährt läuft sitzt auf in dem mit rot blau ball straße park wasser rad".split(),
    "fr": "un homme femme chien enfant est sont roule court assis sur dans le avec rouge bleu balle rue parc eau vélo".split(),
    "cs": "jeden muž žena pes dítě je jsou jede běží sedí na v ten s červený modrý míč ulice park voda kolo".split(),
}


def parallel_lines(n: int, seed: int) -> dict[str, list[str]]:
    """``n`` sentences in every language of WORDS, word for word the same."""
    rng = random.Random(seed)
    picks = [[rng.randrange(len(WORDS["en"])) for _ in range(rng.randint(3, 10))] for _ in range(n)]
    return {lang: [" ".join(words[i] for i in pick).capitalize() + "." for pick in picks] for lang, words in WORDS.items()}


def write_corpus(root: Path, sizes: dict[str, int] = {"train": 300, "valid": 20, "test2016": 20}) -> Path:  # noqa: B006
    """root/{train,valid,test2016}.{en,de,fr,cs}, multi-parallel."""
    root.mkdir(parents=True, exist_ok=True)
    for number, (split, n) in enumerate(sizes.items()):
        for lang, lines in parallel_lines(n, number).items():
            (root / f"{split}.{lang}").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return root


def multilingual_config(corpus: Path, run_dir: Path, pairs=("en-de", "en-fr"), tokenizer: Optional[dict] = None, **data):
    """A tiny config of several directions over ``corpus`` (write_corpus)."""
    from xformer_cli.config import config_from_dict

    tree = {"run_dir": str(run_dir),
            "data": {"pairs": list(pairs), "train": {"prefix": str(corpus / "train")},
                     "valid": {"prefix": str(corpus / "valid")}, "test": {"prefix": str(corpus / "test2016")}, **data},
            "tokenizer": {"vocab_size": 120, **(tokenizer or {})},
            "model": {"d_model": 16, "d_ff": 32, "n_heads": 2, "encoder_layers": 1, "decoder_layers": 1, "dropout": 0.0},
            "decode": {"beam_size": 1, "max_len_a": 0.0, "max_len_b": 12},
            "train": {"device": "cpu", "precision": "fp32"}}
    return config_from_dict(tree)


def multilingual_checkpoint(corpus: Path, path: Path, pairs=("en-de", "en-fr"), seed: int = 0, joint: bool = True,
                            pre_norm: bool = False) -> Path:
    """A checkpoint of a tiny multilingual model as training writes one: its tokenizer trained
    with the tags, random weights shaken so that the tag changes the output."""
    from xformer_cli.checkpoint_file import build_model, save_checkpoint
    from xformer_cli.data.prepare import check_inputs

    config = multilingual_config(corpus, path.parent / "unused-run", pairs)
    config.tokenizer.joint = joint
    config.model.pre_norm = pre_norm
    tokenizer = check_inputs(config, log=lambda _: None).tokenizer
    torch.manual_seed(seed)
    model = build_model(config, tokenizer)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5 * torch.randn_like(p))
    save_checkpoint({"config": config.to_dict(), "tokenizer": tokenizer.state(), "model": model.state_dict()}, path)
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A module's synthetic multi-parallel corpus (write_corpus)."""
    return write_corpus(tmp_path_factory.mktemp("multi") / "m")


@pytest.fixture(scope="module")
def checkpoint(corpus, tmp_path_factory) -> Path:
    """A module's tiny en->de + en->fr checkpoint (multilingual_checkpoint), random weights."""
    return multilingual_checkpoint(corpus, tmp_path_factory.mktemp("ckpt") / "mul.pt")


class FakeMultilingual:
    """What the server needs of a served model (serve/engine.py's ServedModel), translating
    into any of four directions by saying which: "fr: <text reversed>"."""

    name, engine, precision, beam_size, truncated_lines = "fake/mul.pt", "xformer", "fp32", 4, 0
    source, target = "en", "de"  # the first direction: what the page shows first

    def __init__(self):
        from xformer_cli.languages import Languages

        self.languages = Languages.of([("en", "de"), ("en", "fr"), ("de", "en"), ("fr", "en")], tagged=True)
        self.calls = []

    def translate(self, texts, beam_size=None, alternatives=0, wanted=None, target=None, source=None, **options):
        self.calls.append((list(texts), target, source))
        return [f"{target}: {text[::-1]}" if text.strip() else "" for text in texts]
