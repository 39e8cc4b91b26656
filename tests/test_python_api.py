"""The Python API as a caller meets it: what it takes, what it refuses, what it warns about."""

import warnings

import pytest

from xformer_cli.config import DecodeConfig
from xformer_cli.decode.translator import Translator
from xformer_cli.errors import XformerError
from xformer_cli.text import TextOptions, translate_texts

from helpers import untrained_translator


@pytest.fixture(scope="module")
def translator() -> Translator:
    return untrained_translator(DecodeConfig(beam_size=2, max_len_a=1.0, max_len_b=5, max_input_len=8))[0]


def test_lines_of_the_wrong_kind_are_refused_by_name(translator):
    """One string was translated a character a line; None or bytes failed deep inside
    (AttributeError: 'NoneType' object has no attribute 'split')."""
    with pytest.raises(XformerError, match="^lines: give a list of strings, not one str$"):
        translator.translate("a dog runs")
    with pytest.raises(XformerError, match=r"^lines\[1\] is NoneType, not a string$"):
        translator.translate(["a dog", None])
    with pytest.raises(XformerError, match=r"^lines\[0\] is bytes, not a string$"):
        translator.search([b"a dog"], translator.options())
    with pytest.raises(XformerError, match=r"^texts\[0\] is int, not a string$"):
        translate_texts(translator, [5])
    with pytest.raises(XformerError, match="^texts: give a list of strings, not one str$"):
        translate_texts(translator, "a dog runs")


def test_any_iterable_of_lines_translates_as_its_list(translator):
    """A generator was read up before the results were laid out for it: IndexError."""
    lines = ["a dog runs", "two men sit"]
    assert translator.translate(line for line in lines) == translator.translate(lines)
    assert translator.translate(()) == []


def test_options_of_the_wrong_type_are_refused_by_name(translator):
    with pytest.raises(XformerError, match="^decoding option beam_size must be int, got '4'$"):
        translator.translate(["a dog"], beam_size="4")
    with pytest.raises(XformerError, match="^decoding option beam_size must be int, got 2.5$"):
        translator.translate(["a dog"], beam_size=2.5)
    with pytest.raises(XformerError, match="^decoding option length_penalty must be float, got 'x'$"):
        translator.translate(["a dog"], length_penalty="x")
    with pytest.raises(XformerError, match="^decoding option use_cache must be bool, got 1$"):
        translator.options(use_cache=1)
    assert translator.options(length_penalty=1).length_penalty == 1  # an int where a float goes is a number
    assert translator.options(seed=None, beam_size=1, sampling_topk=3, temperature=2).temperature == 2


def test_text_options_outside_their_lists_are_refused():
    """format='md' and aligner='x' were read as text and auto; the CLI refuses --format md."""
    with pytest.raises(XformerError, match="^format must be one of text, html, not 'md'$"):
        TextOptions(format="md")
    with pytest.raises(XformerError, match="^aligner must be one of auto, attention, relative, not 'x'$"):
        TextOptions(aligner="x")
    with pytest.raises(XformerError, match="^alternatives must be a whole number 0 or more, not -1$"):
        TextOptions(alternatives=-1)


def test_a_line_cut_to_the_models_input_length_warns_the_caller(translator):
    """engine.translate takes each line as one input: a line past decode.max_input_len pieces is
    cut, which only a counter said; translate_texts (the CLI's path) translates it whole."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        translator.translate(["a dog runs"])  # within the 8 pieces: no warning
    with pytest.warns(UserWarning, match="^1 line\\(s\\) longer than 8 pieces were cut to it; "
                                         "xformer_cli.text.translate_texts"):
        translator.translate(["a dog runs in the park while two men sit on a bench", "a dog"])


def test_an_ensemble_of_models_for_other_directions_is_refused(tmp_path):
    """Two models on one joint vocabulary, en->de and de->en: their ensemble translated into a
    mix of both languages, with exit 0. Models of one direction (any spelling) still ensemble."""
    from xformer_cli.checkpoint_file import save_checkpoint
    from xformer_cli.config import Config, CorpusConfig, DataConfig, TokenizerConfig

    engine, lines = untrained_translator()

    def saved(name: str, src: str, tgt: str):
        config = Config(data=DataConfig(src_lang=src, tgt_lang=tgt, train=[CorpusConfig(prefix="corpus")]),
                        tokenizer=TokenizerConfig(joint=True, vocab_size=40), model=engine.model.cfg)
        tokenizer = {"src": engine.tokenizer.src_model_bytes, "tgt": engine.tokenizer.tgt_model_bytes}
        save_checkpoint({"config": config.to_dict(), "model": engine.model.state_dict(), "step": 1,
                         "tokenizer": tokenizer}, tmp_path / name)
        return tmp_path / name

    forward, backward = saved("en-de.pt", "en", "de"), saved("de-en.pt", "de", "en")
    spelled = saved("eng-deu.pt", "eng", "deu")
    with pytest.raises(XformerError, match=f"^{backward} translates de->en, {forward} en->de: an ensemble's models "
                                           "translate the same directions$"):
        Translator.from_checkpoint([forward, backward], device="cpu")
    pair = Translator.from_checkpoint([forward, spelled], device="cpu")
    assert len(pair.translate(lines[:2], beam_size=1)) == 2


def test_the_attention_plotted_is_of_the_search_asked_for(translator):
    """--attention translated the lines again with the beam alone: a run's --min-len, length
    penalty and limits were not in the translation it drew."""
    line = ["a dog runs in the park"]
    search = translator.options(beam_size=2, min_len=6, max_len_a=0.0, max_len_b=6)
    (drawn,) = translator.attention(line, search=search)
    (best, *_), = translator.search(line, search)
    assert drawn.target == translator.tokenizer.tgt_pieces(best.tokens) + ["</s>"] and len(drawn.target) == 7
    (plain,) = translator.attention(line, beam_size=2)
    assert plain.target != drawn.target
