"""One model, many directions (issue 27): the config's pairs and their one-line refusals, the
tags as single pieces, per-pair sampling, the data a multilingual run reads, translate's
--target-lang, the exports and the server. Unit tier: synthetic multi-parallel files
(tests/multilingual_fixture.py), random weights. The slow tests train on a larger synthetic corpus."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import quiet, write_lines
from multilingual_fixture import corpus, checkpoint  # noqa: F401 (module fixtures)
from multilingual_fixture import multilingual_checkpoint, multilingual_config, parallel_lines, write_corpus
from xformer_cli.config import config_from_dict
from xformer_cli.errors import XformerError

TAGS = {"de": ">>deu<<", "fr": ">>fra<<", "cs": ">>ces<<"}


# -- the config ------------------------------------------------------------------------------------

def test_pairs_read_their_corpora_with_their_languages_and_a_bilingual_config_is_unchanged():
    base = {"train": {"prefix": "m/train"}, "valid": {"prefix": "m/valid"}}
    cfg = config_from_dict({"data": {**base, "pairs": ["en-de", {"src_lang": "de", "tgt_lang": "fr",
                                                                  "train": [{"prefix": "other/train"}]}]}}).data
    directions = cfg.directions()
    assert [(d.src_lang, d.tgt_lang) for d in directions] == [("en", "de"), ("de", "fr")]
    assert directions[0].train[0].prefix == "m/train" and directions[1].train[0].prefix == "other/train"
    assert directions[1].valid.prefix == "m/valid"  # what a pair leaves out comes from data.*
    assert dict(cfg.languages().tags) == {"de": ">>deu<<", "fr": ">>fra<<"}
    bilingual = config_from_dict({"data": {**base, "src_lang": "en", "tgt_lang": "de"}}).data
    assert [(d.src_lang, d.tgt_lang) for d in bilingual.directions()] == [("en", "de")]
    assert not bilingual.languages().tagged  # one target: no tags, the model reads what it always read
    many_to_one = config_from_dict({"data": {**base, "pairs": ["de-en", "fr-en"]}}).data
    assert not many_to_one.languages().tagged  # one target language needs no tag (OPUS-MT's mul-en)


@pytest.mark.parametrize("data, fragment", [
    ({"pairs": ["en-de", "en-xx"]}, "config key 'data.pairs[1].tgt_lang': unknown language code 'xx'"),
    ({"pairs": ["en-de", "en-fr"], "train": []}, "config key 'data.pairs[0].train': en-de has no training data"),
    ({"pairs": ["ende"]}, "config key 'data.pairs[0]': expected SRC-TGT such as en-de"),
    ({"pairs": ["en-de", "en-de"]}, "config key 'data.pairs[1]': en-de is listed twice"),
    ({"pairs": ["en-en"]}, "config key 'data.pairs[0].tgt_lang': must differ"),
    ({"pairs": ["en-de", {"src_lang": "en", "tgt_lang": "fr", "weight": 2}], "sampling_temperature": 5},
     "config key 'data.pairs[1].weight': give pair weights or data.sampling_temperature, not both"),
    ({"pairs": ["en-de", "en-fr"], "sampling_temperature": 0}, "config key 'data.sampling_temperature': must be positive"),
    ({"pairs": ["en-de", "en-gsw"], "lang_tags": {"gsw": "gsw"}}, "config key 'data.lang_tags.gsw'"),
    ({"pairs": ["en-de", "en-fr"], "target_tag": "bos"}, "config key 'data.target_tag'"),
    # fixed files or columns shared by several pairs: every pair got the same two sides
    ({"pairs": ["en-de", "de-en"], "train": {"src": "t.en", "tgt": "t.de"}},
     "config key 'data.train.src': is read the same for every pair that shares it (en-de, de-en)"),
    ({"pairs": ["en-de", "en-fr"], "train": {"data_files": "t.jsonl", "src_column": "en", "tgt_column": "de"}},
     "config key 'data.train.src_column': is read the same"),
    ({"pairs": ["en-de", "en-fr"], "valid": {"src": "v.en", "tgt": "v.de"}}, "config key 'data.valid.src'"),
])
def test_bad_pairs_are_refused_naming_the_key(data, fragment):
    with pytest.raises(XformerError) as caught:
        config_from_dict({"data": {"train": {"prefix": "m/train"}, **data}})
    assert fragment in str(caught.value) and "\n" not in str(caught.value)


def test_language_codes_and_their_tags():
    from xformer_cli.languages import Languages, code_of_tag, tag_for

    assert [tag_for(c) for c in ("de", "fr", "cs", "deu", "cmn_Hans")] == [">>deu<<", ">>fra<<", ">>ces<<", ">>deu<<",
                                                                            ">>cmn_Hans<<"]
    assert [code_of_tag(t) for t in (">>fra<<", ">>cmn_Hans<<")] == ["fr", "cmn_Hans"]
    assert tag_for("xx", {"xx": ">>xxx<<"}) == ">>xxx<<"
    langs = Languages.of([("en", "de"), ("en", "fr"), ("de", "en")], tagged=True)
    assert (langs.target("fra"), langs.target(">>deu<<"), langs.source("eng")) == ("fr", "de", "en")
    assert langs.sources_into("en") == ["de"] and not langs.trained("de", "fr")
    # any case, and a region's variant (serve's target fr-FR), name the language; a script does not
    assert (langs.target("FRA"), langs.target(">>FRA<<"), langs.target("fr-FR"), langs.target("fr_CA")) == ("fr",) * 4
    with pytest.raises(XformerError, match="zh-Hant: this model translates into de, fr, en only"):
        langs.target("zh-Hant")
    from xformer_cli.languages import plain_code

    assert [plain_code(c) for c in ("fr", "fra", "FRA", ">>fra<<", "cmn_Hans")] == ["fr", "fr", "fr", "fr", "cmn_Hans"]
    with pytest.raises(XformerError, match="translates into de, fr, en: say which with --target-lang"):
        langs.target(None)
    with pytest.raises(XformerError, match="--target-lang es: this model translates into de, fr, en only"):
        langs.target("es")
    assert Languages.from_dict(langs.to_dict()) == langs
    with pytest.raises(XformerError, match="--target-lang fr: this model translates en->de only"):
        Languages.of([("en", "de")]).target("fr")


# -- tags and the tokenizer -----------------------------------------------------------------------

def test_tags_are_single_pieces_and_lead_the_source(checkpoint):
    from xformer_cli.checkpoint_file import load_model

    _, tokenizer, config = load_model(checkpoint)
    assert config.data.languages().tags == (("de", ">>deu<<"), ("fr", ">>fra<<"))
    for tag in (">>deu<<", ">>fra<<"):
        tag_id = tokenizer.tag_id(tag)
        assert tokenizer.src.id_to_piece(tag_id) == tag
        tagged, plain = tokenizer.encode_src([f"{tag} A man rides.", "A man rides."])
        assert tagged == [tag_id] + plain  # the tag is split off before sentencepiece, as MarianTokenizer does
        assert tokenizer.src_pieces(f"{tag} A man.")[0] == tag
    assert tokenizer.encode_src([">>spa<< A"])[0][0] not in tokenizer.src_tags.values()  # not a tag of this model


def test_a_given_tokenizer_whose_tag_splits_is_refused_in_one_line(corpus, tmp_path):
    from xformer_cli.data.prepare import check_inputs
    from xformer_cli.tokenizer import Tokenizer

    lines = parallel_lines(200, 5)
    plain = Tokenizer.train(lines["en"], lines["de"] + lines["fr"], joint=True, vocab_size=120)  # no tags
    plain.save(tmp_path / "tok")
    config = multilingual_config(corpus, tmp_path / "run", tokenizer={"model": str(tmp_path / "tok" / "joint.model")})
    with pytest.raises(XformerError) as caught:
        check_inputs(config, log=quiet)
    message = str(caught.value)
    assert "tokenizer.model" in message and "the tag >>deu<< is not one piece" in message and "splits into" in message
    assert "\n" not in message and not (tmp_path / "run").exists()  # nothing written


def test_the_tokenizer_sample_is_balanced_across_languages(corpus, tmp_path):
    """en is read by both pairs (the same file): it counts once, as much as de and fr."""
    from xformer_cli.data.directions import language_sample, train_sources

    config = multilingual_config(corpus, tmp_path / "run", pairs=("en-de", "en-fr", "de-fr"))
    sources = train_sources(config.data, quiet)
    by_language = language_sample(sources, config.data, 450, seed=1)
    assert {lang: len(lines) for lang, lines in by_language.items()} == {"en": 150, "de": 150, "fr": 150}
    everything = language_sample(sources, config.data, 10**6, seed=1)
    assert {lang: len(lines) for lang, lines in everything.items()} == {"en": 300, "de": 300, "fr": 300}


def test_a_smaller_language_is_repeated_to_the_share_the_sampling_temperature_gives_it():
    """As training samples a small pair by temperature, so does the tokenizer: n_max * (n / n_max)^(1/T)."""
    from xformer_cli.data.directions import balance

    drawn = {"en": [f"en {i}" for i in range(3200)], "de": [f"de {i}" for i in range(2900)],
             "cs": [f"cs {i}" for i in range(300)]}
    assert balance(drawn, 1.0, seed=1) == drawn  # T = 1: as drawn
    hot = balance(drawn, 5.0, seed=1)
    assert {lang: len(lines) for lang, lines in hot.items()} == {"en": 3200, "de": 3138, "cs": 1993}
    assert hot["cs"][:900] == drawn["cs"] * 3 and set(hot["cs"]) == set(drawn["cs"])  # whole copies, then a subset
    assert len(set(hot["cs"][1800:])) == 193 and hot == balance(drawn, 5.0, seed=1)  # distinct, and seeded
    assert {len(lines) for lines in balance(drawn, 1e9, seed=1).values()} == {3200}  # T -> inf: all equal


# -- the data a run reads ---------------------------------------------------------------------------

def test_prepared_data_holds_every_pair_tagged_and_valid_sets_per_direction(corpus, tmp_path):
    from xformer_cli.data.prepare import prepare_data

    config = multilingual_config(corpus, tmp_path / "run", pairs=("en-de", "en-fr", "de-fr"))
    prepared = prepare_data(config, log=quiet)
    tok = prepared.tokenizer
    assert prepared.train.source_pairs == [300, 300, 300]
    starts = [int(prepared.train.src_ids[prepared.train.src_offsets[i]]) for i in (0, 300, 600)]
    assert starts == [tok.tag_id(">>deu<<"), tok.tag_id(">>fra<<"), tok.tag_id(">>fra<<")]
    assert list(prepared.valid_sets) == [("en", "de"), ("en", "fr"), ("de", "fr")]
    assert prepared.valid_sets[("de", "fr")].src == parallel_lines(20, 1)["de"]  # untagged, the pair's languages
    assert prepared.valid_encoded_sets[("en", "fr")].src[0][0] == tok.tag_id(">>fra<<")
    assert len(prepared.valid) == 60 and prepared.valid.src[20].startswith(">>fra<< ")  # validation's one set, tagged
    assert prepared.valid_encoded.src[0][0] == tok.tag_id(">>deu<<")
    assert list(prepared.test_sets) == [("en", "de"), ("en", "fr"), ("de", "fr")]


def test_a_pair_left_without_data_stops_the_run_in_one_line(corpus, tmp_path):
    from xformer_cli.data.prepare import prepare_data

    long_lines = {lang: [" ".join(line for line in lines[:12]) for _ in range(30)]
                  for lang, lines in parallel_lines(12, 3).items()}
    for lang in ("en", "de"):
        (tmp_path / f"long.{lang}").write_text("".join(line + "\n" for line in long_lines[lang]), encoding="utf-8")
    config = multilingual_config(corpus, tmp_path / "run", max_len=60,
                                 pairs=[{"src_lang": "en", "tgt_lang": "de", "train": {"prefix": str(tmp_path / "long")}},
                                        "en-fr"])
    with pytest.raises(XformerError, match=r"data.pairs\[0\] \(en-de\): no training pair left"):
        prepare_data(config, log=quiet)


# -- per-pair sampling -----------------------------------------------------------------------------

class _Cache:
    def __init__(self, sizes):
        n = sum(sizes)
        self.src_lens = self.tgt_lens = np.arange(1, n + 1) % 37 + 1
        self.source_pairs = sizes


def _taken(picked, sizes) -> list[int]:
    bounds = np.cumsum([0, *sizes])
    return [int(((picked >= a) & (picked < b)).sum()) for a, b in zip(bounds[:-1], bounds[1:])]


def _data(**data):
    return config_from_dict({"data": {"train": {"prefix": "m/train"}, "pairs": ["en-de", "en-fr", "en-cs"], **data}}).data


@pytest.mark.parametrize("temperature", [2.0, 5.0])
def test_temperature_sampling_gives_each_pair_its_share(temperature):
    from xformer_cli.data.weights import epoch_pairs

    sizes = [3000, 600, 100]
    picked, src, _ = epoch_pairs(_Cache(sizes), _data(sampling_temperature=temperature), seed=1, epoch=1)
    shares = np.array(sizes, float) ** (1 / temperature)
    expected = shares / shares.sum() * sum(sizes)
    taken = _taken(picked, sizes)
    assert all(abs(t - e) <= 1 for t, e in zip(taken, expected)), (taken, expected)
    assert taken[2] > 100 and taken[0] < 3000  # the small pair drawn more often, the large one less
    assert len(src) == len(picked) and abs(sum(taken) - sum(sizes)) <= 2  # an epoch as long as the data


def test_explicit_pair_weights_multiply_the_corpus_weights_and_draw_per_seed_and_epoch():
    from xformer_cli.config import CorpusConfig
    from xformer_cli.data.weights import epoch_pairs

    sizes = [400, 200, 100, 100]  # en-cs reads two corpora, the second at weight 0.5
    data = _data(pairs=["en-de", {"src_lang": "en", "tgt_lang": "fr", "weight": 2.5},
                        {"src_lang": "en", "tgt_lang": "cs", "weight": 0.5,
                         "train": [{"prefix": "a"}, {"prefix": "b", "weight": 0.5}]}])
    assert isinstance(data.directions()[2].train[1], CorpusConfig)
    picked, _, _ = epoch_pairs(_Cache(sizes), data, seed=1, epoch=1)
    assert _taken(picked, sizes) == [400, 500, 50, 25]
    again, _, _ = epoch_pairs(_Cache(sizes), data, seed=1, epoch=1)
    other, _, _ = epoch_pairs(_Cache(sizes), data, seed=1, epoch=2)
    assert np.array_equal(picked, again) and not np.array_equal(picked, other)
    counts = Counter(picked[(picked >= 400) & (picked < 600)].tolist())
    assert sorted(set(counts.values())) == [2, 3]  # 2.5: every en-fr pair twice, half of them a third time
    assert epoch_pairs(_Cache([3, 3, 3]), _data(), seed=1, epoch=1)[0] is None  # weights 1, T 1: the whole cache


def test_the_bilingual_call_with_data_train_still_works_and_a_mismatch_is_loud():
    from xformer_cli.config import CorpusConfig
    from xformer_cli.data.weights import epoch_pairs

    picked, _, _ = epoch_pairs(_Cache([300, 200]), [CorpusConfig(), CorpusConfig(weight=0.5)], seed=1, epoch=1)
    assert _taken(picked, [300, 200]) == [300, 100]
    with pytest.raises(XformerError, match="pass the DataConfig"):
        epoch_pairs(_Cache([300, 200, 100]), [CorpusConfig()], seed=1, epoch=1)


# -- translation -----------------------------------------------------------------------------------

def test_the_engine_takes_the_target_language(checkpoint):
    from xformer_cli import Translator

    engine = Translator.from_checkpoint(checkpoint, device="cpu")
    lines = parallel_lines(12, 9)["en"]
    de = engine.translate(lines, target_lang="de")
    assert engine.translate(lines, target_lang="deu") == de  # ISO 639-3 names the same language
    assert engine.translate([f">>deu<< {line}" for line in lines]) == de  # a tag in the text, MarianTokenizer's way
    assert engine.translate([f">>deu<< {line}" for line in lines], target_lang="fr") == de  # a line's own tag stays
    assert engine.translate(lines, target_lang="fr") != de  # the tag is read
    with pytest.raises(XformerError, match="this model translates into de, fr: give target_lang"):
        engine.translate(lines)
    with pytest.raises(XformerError, match="target_lang es: this model translates into de, fr only"):
        engine.translate(lines, target_lang="es")


def test_the_validation_engine_decodes_a_direction_given_the_languages(checkpoint):
    """What per-direction validation will call: the in-memory model, the config's languages."""
    from xformer_cli import Translator
    from xformer_cli.checkpoint_file import load_model
    from xformer_cli.decode.factory import engine_for_model

    model, tokenizer, config = load_model(checkpoint)
    engine = engine_for_model(model, tokenizer, config.decode_settings(), torch.device("cpu"), "fp32",
                              config.data.languages())
    lines = parallel_lines(5, 12)["en"]
    reference = Translator.from_checkpoint(checkpoint, device="cpu")
    assert engine.translate(lines, target_lang="fr") == reference.translate(lines, target_lang="fr")


def test_the_text_pipeline_takes_the_target_language(checkpoint):
    from xformer_cli import Translator
    from xformer_cli.text import TextOptions, translate_texts

    engine = Translator.from_checkpoint(checkpoint, device="cpu")
    line = parallel_lines(1, 4)["en"][0]
    for target in ("de", "fr"):
        result = translate_texts(engine, [line], TextOptions(target_lang=target))[0]
        assert result.text == engine.translate([line], target_lang=target)[0]


def cli(*args: str, stdin: str = ""):
    """The CLI in this process (typer's runner): the unit tier starts no process."""
    from typer.testing import CliRunner

    from xformer_cli.cli import app

    return CliRunner().invoke(app, [str(a) for a in args], input=stdin)


def test_translate_refuses_a_missing_or_unknown_target_lang_in_one_line(checkpoint):
    for args, fragment in (((), "this model translates into de, fr: say which with --target-lang"),
                           (("-t", "es"), "--target-lang es: this model translates into de, fr only"),
                           (("-t", "de", "--source-lang", "cs"), "--source-lang cs: this model reads en only")):
        result = cli("translate", "-m", checkpoint, *args, stdin="A man.\n")
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert result.exit_code == 1 and lines[-1].startswith("error: ") and fragment in lines[-1], result.output
        assert sum(line.startswith("error") for line in lines) == 1
    ok = cli("translate", "-m", checkpoint, "-t", "fr", "--engine", "xformer", stdin="A man.\n\nA dog.\n")
    assert ok.exit_code == 0, ok.output


def test_translate_refuses_a_target_lang_a_bilingual_model_lacks(corpus, tmp_path):
    bilingual = multilingual_checkpoint(corpus, tmp_path / "en-de.pt", pairs=("en-de",))
    result = cli("translate", "-m", bilingual, "-t", "fr", stdin="A man.\n")
    assert result.exit_code == 1 and "--target-lang fr: this model translates en->de only" in result.output
    assert cli("translate", "-m", bilingual, "-t", "de", "--engine", "xformer", stdin="A man.\n").exit_code == 0


def test_zero_shot_is_allowed_with_a_warning(corpus, tmp_path):
    from xformer_cli.decode.direction import choose_direction
    from xformer_cli.languages import Languages

    said = []
    langs = Languages.of([("en", "de"), ("de", "en"), ("en", "fr"), ("fr", "en")], tagged=True)
    direction = choose_direction(langs, "fr", "de", log=said.append)
    assert (direction.source, direction.target, direction.trained) == ("de", "fr", False)
    assert len(said) == 1 and said[0].startswith("warning: de->fr is zero-shot")
    detected = choose_direction(langs, "en", None, text=lambda: "Zwei Hunde spielen im Schnee mit einem Ball.",
                                log=said.append)
    assert detected.source == "de" and detected.trained and "detected among de, fr" in said[-1]


# -- export ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("pre_norm", [False, True], ids=["post-norm", "pre-norm"])
def test_huggingface_export_reads_the_tags_and_generate_agrees(checkpoint, corpus, tmp_path, pre_norm):
    transformers = pytest.importorskip("transformers")
    from xformer_cli import Translator
    from xformer_cli.export.huggingface import export_huggingface

    if pre_norm:  # the multilingual config's model: exported as Pegasus, with the same tokenizer files
        checkpoint = multilingual_checkpoint(corpus, tmp_path / "pre.pt", pre_norm=True)
    out = export_huggingface(checkpoint, tmp_path / "hf")
    tok = transformers.MarianTokenizer.from_pretrained(out)
    model, loading = transformers.AutoModelForSeq2SeqLM.from_pretrained(out, output_loading_info=True)
    model.eval()
    assert type(model).__name__ == ("PegasusForConditionalGeneration" if pre_norm else "MarianMTModel")
    # Every weight from the file: Pegasus's sinusoid tables too (else "MISSING ... newly initialized")
    assert not any(loading.values()), loading  # no missing, unexpected or mismatched key, no error
    assert tok.supported_language_codes == [">>deu<<", ">>fra<<"]
    ours = Translator.from_checkpoint(checkpoint, device="cpu")
    lines = parallel_lines(10, 3)["en"]
    for target, tag in (("de", ">>deu<<"), ("fr", ">>fra<<")):
        tagged = [f"{tag} {line}" for line in lines]
        theirs_ids = tok(tagged).input_ids
        assert [ids[:-1] for ids in theirs_ids] == ours.tokenizer.encode_src(tagged)  # the same source ids, tag first
        opts = ours.options(beam_size=1, max_len_a=0.0, max_len_b=11, min_len=1, target_lang=target)
        with torch.no_grad():
            out_ids = model.generate(**tok(tagged, return_tensors="pt", padding=True), num_beams=1, max_new_tokens=12,
                                     do_sample=False)
        special = {0, 2, 3}
        assert [[t for t in row if t not in special] for row in out_ids.tolist()] == \
            [h[0].tokens for h in ours.search(lines, opts)]
        assert tok.batch_decode(out_ids, skip_special_tokens=True) == \
            ours.translate(lines, target_lang=target, beam_size=1, max_len_a=0.0, max_len_b=11)
    info = json.loads((out / "xformer_export.json").read_text())
    assert info["languages"]["pairs"] == [["en", "de"], ["en", "fr"]]
    assert json.loads((out / "tokenizer_config.json").read_text())["target_lang"] == "mul"


@pytest.mark.parametrize("pre_norm", [False, True], ids=["post-norm", "pre-norm"])
def test_huggingface_export_imports_back_with_every_direction(checkpoint, corpus, tmp_path, pre_norm):
    pytest.importorskip("transformers")
    from xformer_cli import Translator
    from xformer_cli.export.huggingface import export_huggingface
    from xformer_cli.importers.marian import import_marian

    if pre_norm:
        checkpoint = multilingual_checkpoint(corpus, tmp_path / "pre.pt", pre_norm=True)

    back = Translator.from_checkpoint(import_marian(str(export_huggingface(checkpoint, tmp_path / "hf")),
                                                    tmp_path / "back.pt"), device="cpu")
    first = Translator.from_checkpoint(checkpoint, device="cpu")
    assert back.languages == first.languages
    lines = parallel_lines(6, 8)["en"]
    assert back.translate(lines, target_lang="fr", beam_size=1) == first.translate(lines, target_lang="fr", beam_size=1)


def test_ctranslate2_export_translates_with_the_tag(checkpoint, tmp_path):
    pytest.importorskip("ctranslate2")
    from xformer_cli import Translator
    from xformer_cli.decode.ct2_engine import CTranslate2Translator
    from xformer_cli.export.ctranslate2 import export_ctranslate2

    ct2 = CTranslate2Translator.from_directory(export_ctranslate2(checkpoint, tmp_path / "ct2"))
    ours = Translator.from_checkpoint(checkpoint, device="cpu")
    assert ct2.languages == ours.languages
    lines = parallel_lines(10, 6)["en"]
    for target in ("de", "fr"):
        assert ct2.translate(lines, beam_size=1, target_lang=target) == ours.translate(lines, beam_size=1, target_lang=target)
    assert ct2.translate(lines, beam_size=1, target_lang="de") != ct2.translate(lines, beam_size=1, target_lang="fr")
    with pytest.raises(XformerError, match="give target_lang"):
        ct2.translate(lines)


# -- serve -----------------------------------------------------------------------------------------

def test_the_server_lists_every_direction_and_the_target_picks_the_tag():
    pytest.importorskip("fastapi")
    from starlette.testclient import TestClient

    from multilingual_fixture import FakeMultilingual
    from xformer_cli.serve.app import create_app

    engine = FakeMultilingual()
    with TestClient(create_app(engine)) as client:
        assert client.get("/languages").json() == [
            {"code": "en", "name": "English", "targets": ["de", "fr"]},
            {"code": "de", "name": "German", "targets": ["en"]},
            {"code": "fr", "name": "French", "targets": ["en"]}]
        res = client.post("/translate", json={"q": ["A man.", "A dog."], "source": "en", "target": "fr"})
        assert res.json() == {"translatedText": ["fr: .nam A", "fr: .god A"]} and engine.calls[-1][1:] == ("fr", "en")
        res = client.post("/translate", json={"q": "Zwei Hunde spielen im Schnee mit einem roten Ball.",
                                              "source": "auto", "target": "en"})
        body = res.json()
        assert res.status_code == 200 and body["detectedLanguage"]["language"] == "de", body
        assert engine.calls[-1][1:] == ("en", "de")  # detected among the model's sources into en: de, fr
        for source, target in (("de", "fr"), ("en", "es"), ("cs", "en")):
            res = client.post("/translate", json={"q": "x", "source": source, "target": target})
            assert res.status_code == 400 and res.json() == {
                "error": f"{source}->{target} is not supported: this model translates en->de, en->fr, de->en, fr->en"}
        res = client.post("/translate", json={"q": "A man.", "source": "eng", "target": "fra"})  # ISO 639-3 codes
        assert res.status_code == 200 and engine.calls[-1][1:] == ("fr", "en")
        assert client.get("/health").json()["pairs"] == [["en", "de"], ["en", "fr"], ["de", "en"], ["fr", "en"]]
        assert '"pairs": [["en", "de"]' in client.get("/").text  # the page offers the targets from these


def test_a_served_multilingual_checkpoint_translates_into_the_target_asked_for(checkpoint):
    pytest.importorskip("fastapi")
    from xformer_cli import Translator
    from xformer_cli.serve.engine import load_served_model

    served = load_served_model(checkpoint, engine="xformer", precision="fp32")
    assert served.languages.pairs == (("en", "de"), ("en", "fr")) and (served.source, served.target) == ("en", "de")
    line = parallel_lines(1, 2)["en"][0]
    engine = Translator.from_checkpoint(checkpoint, device="cpu")
    for target in ("de", "fr"):
        assert served.translate([line], target=target)[0].text == engine.translate([line], target_lang=target)[0]
    with pytest.raises(XformerError, match="--target es: this model translates into de, fr only"):
        load_served_model(checkpoint, engine="xformer", precision="fp32", target="es")


# -- slow: training ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def parallel_corpus(tmp_path_factory) -> Path:
    """A multi-parallel corpus in Multi30k's file names (train / valid / test2016 .en .de .fr .cs), written
    here: synthetic sentences (multilingual_fixture.write_corpus), so the tests run on every machine, not
    only where the shared folder holds Multi30k's French side (the Hub copy is English-German only)."""
    return write_corpus(tmp_path_factory.mktemp("m30k-fr") / "m", {"train": 3000, "valid": 50, "test2016": 100})


def two_direction_config(corpus: Path, run_dir: Path, steps: int, **more):
    """en->de and en->fr on ``corpus`` (train / valid / test2016 prefixes), a small model, fp32 (the same
    numbers on every CPU), bounded by steps, not minutes."""
    from xformer_cli.config import load_config

    sets = {"run_dir": run_dir, "data.pairs": "[en-de, en-fr]", "data.train.prefix": corpus / "train",
            "data.valid.prefix": corpus / "valid", "data.test.prefix": corpus / "test2016",
            "data.train.fallback_dataset": "null", "data.valid.fallback_dataset": "null",
            "data.test.fallback_dataset": "null", "data.valid_max_sentences": 50,
            "tokenizer.vocab_size": 2000, "model.d_model": 128, "model.d_ff": 256, "model.encoder_layers": 2,
            "model.decoder_layers": 2, "train.max_steps": steps, "train.max_minutes": 0, "train.max_tokens": 1500,
            "train.warmup_steps": 100, "train.lr_scale": 1.0, "train.valid_every": steps, "train.save_every": 0,
            "train.cooldown": 0, "train.validations": 0,  # the paper's schedule: max_steps can grow on resume
            "train.keep_checkpoints": 0, "train.average_last": 0, "train.tune_length_penalty": "[]",
            "train.precision": "fp32", "train.device": "cpu", "train.threads": 1, "train.log_every": 50,
            "decode.max_len_a": 1.2, "decode.max_len_b": 10, **more}
    return load_config("configs/multi30k.yaml", [f"{k}={v}" for k, v in sets.items()])


@pytest.mark.slow
def test_a_model_trained_on_two_directions_answers_in_the_language_asked_for(parallel_corpus, tmp_path):
    """200 steps of en->de and en->fr (under a minute on a CPU): on 100 test2016 lines of each
    direction, under 10% of the outputs are in another language than the one asked for (4% and 0%
    when written; 7% at 150 steps, too near the bound)."""
    from xformer_cli import Translator
    from xformer_cli.data.directions import checkpoint_test_sets
    from xformer_cli.decode.direction_scores import score_directions
    from xformer_cli.train.trainer import train

    result = train(two_direction_config(parallel_corpus, tmp_path / "run", 200), log=quiet, progress=False)
    assert result.steps == 200
    best = tmp_path / "run" / "best.pt"
    sets = {d: corpus for d, corpus in checkpoint_test_sets(best, log=quiet).items()}
    for corpus in sets.values():
        corpus.src, corpus.tgt = corpus.src[:100], corpus.tgt[:100]
    engine = Translator.from_checkpoint(best, device="cpu")
    results = score_directions(engine, sets, engine.languages, search={"beam_size": 1})
    assert [r.name for r in results] == ["en->de", "en->fr"]
    for r in results:
        assert r.scored >= 95 and r.off_target is not None and r.off_target_rate < 0.10, (r.name, r.off_target, r.scored)
        assert r.scores[1].score > 10  # chrF: words of the language, not noise
    assert results[0].hypotheses != results[1].hypotheses


@pytest.mark.slow
def test_several_pairs_with_temperature_sampling_resume_bit_identically(parallel_corpus, tmp_path):
    """en->de on 3000 pairs, en->fr on 400 drawn at temperature 3 (so each epoch draws): a run
    stopped mid-epoch and resumed gives the uninterrupted run's losses and weights bit for bit."""
    from helpers import head, losses, write_lines
    from xformer_cli.checkpoint_file import load_checkpoint
    from xformer_cli.train.trainer import train

    corpus = tmp_path / "m30k"
    corpus.mkdir()
    for split, n in (("train", 3000), ("few", 400), ("valid", 30), ("test2016", 30)):
        for lang in ("en", "de", "fr"):
            source = parallel_corpus / f"{'train' if split == 'few' else split}.{lang}"
            write_lines(corpus / f"{split}.{lang}", head(source, n))
    pairs = f"[en-de, {{src_lang: en, tgt_lang: fr, train: {{prefix: {corpus / 'few'}}}}}]"
    sets = {"data.pairs": pairs, "data.sampling_temperature": 3, "model.d_model": 32, "model.d_ff": 64,
            "model.encoder_layers": 1, "model.decoder_layers": 1, "tokenizer.vocab_size": 500, "train.max_tokens": 600,
            "train.log_every": 1, "train.valid_every": 100, "train.save_every": 0, "model.dropout": 0.1}
    config = lambda run, steps: two_direction_config(corpus, tmp_path / run, steps, **sets)  # noqa: E731
    train(config("a", 12), log=quiet, progress=False)
    train(config("b", 6), log=quiet, progress=False)
    state = load_checkpoint(tmp_path / "b" / "last.pt")
    assert state["epoch"] == 1 and 0 < state["batches_done"]  # stopped inside the first epoch
    train(config("b", 12), log=quiet, progress=False)
    a, b = losses(tmp_path / "a"), losses(tmp_path / "b")
    assert sorted(b) == list(range(1, 13))
    for step in range(7, 13):
        assert b[step] == a[step], step
    wa, wb = load_checkpoint(tmp_path / "a" / "last.pt")["model"], load_checkpoint(tmp_path / "b" / "last.pt")["model"]
    assert all(torch.equal(wa[key], wb[key]) for key in wa)


# -- more sources, detection without py3langid, eval-bleu per direction ----------------------------------

def test_pairs_read_a_dataset_and_tsv_files_with_their_languages(tmp_path):
    """A Hugging Face dataset with a translation column of three languages (save_to_disk) serves
    en-de and en-fr; a TSV pair reads its own columns."""
    datasets = pytest.importorskip("datasets")
    from xformer_cli.data.directions import eval_sets, train_sources

    lines = parallel_lines(40, 2)
    rows = [{lang: lines[lang][i] for lang in ("en", "de", "fr")} for i in range(40)]
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"translation": rows}),
                          "validation": datasets.Dataset.from_dict({"translation": rows[:5]})}).save_to_disk(tmp_path / "ds")
    (tmp_path / "cs.tsv").write_text("src\ttgt\n" + "".join(f"{e}\t{c}\n" for e, c in zip(lines["en"], lines["cs"])),
                                     encoding="utf-8")
    tsv = {"data_files": str(tmp_path / "cs.tsv"), "src_column": "src", "tgt_column": "tgt"}
    data = config_from_dict({"data": {"train": {"dataset": str(tmp_path / "ds")}, "valid": {"dataset": str(tmp_path / "ds")},
                                      "pairs": ["en-de", "en-fr", {"src_lang": "en", "tgt_lang": "cs", "train": tsv,
                                                                   "valid": {**tsv, "split": "train"}}]}}).data
    sources = train_sources(data, quiet)
    assert [list(source)[0] for source in sources] == [(lines["en"][0], lines[t][0]) for t in ("de", "fr", "cs")]
    assert [source.tag for source in sources] == [">>deu<<", ">>fra<<", ">>ces<<"]
    # the English of the one dataset read by two pairs is one text: the tokenizer's sample counted it twice
    assert sources[0].side_key(0) == sources[1].side_key(0) and sources[0].side_key(1) != sources[1].side_key(1)
    valid = eval_sets(data, "valid")
    assert {d: (len(c), c.tgt[0]) for d, c in valid.items()} == {
        ("en", "de"): (5, lines["de"][0]), ("en", "fr"): (5, lines["fr"][0]), ("en", "cs"): (40, lines["cs"][0])}


def test_a_direction_without_a_valid_set_is_said_not_to_be_validated(tmp_path):
    """docs/multilingual.md: every direction is validated on its own set; a pair left without
    one was silently never validated, and best.pt picked on the others."""
    from xformer_cli.data.directions import eval_sets

    lines = parallel_lines(10, 2)
    for lang in ("en", "de"):
        write_lines(tmp_path / f"v.{lang}", lines[lang])
    data = config_from_dict({"data": {"train": {"prefix": "m/train"}, "valid": None,
                                      "pairs": [{"src_lang": "en", "tgt_lang": "de", "valid": {"prefix": str(tmp_path / "v")}},
                                                "en-fr"]}}).data
    said: list[str] = []
    assert list(eval_sets(data, "valid", said.append)) == [("en", "de")]
    assert said == ["warning: no valid set for en-fr (data.pairs[1].valid): not validated, and best.pt is picked "
                    "on the others' scores"]
    said.clear()
    eval_sets(data, "test", said.append)  # no test sets at all: nothing to say
    assert said == []


def test_a_tokenizer_sampled_at_another_temperature_is_not_reused():
    """The temperature balances the tokenizer's sample per language; a run at another one reused
    the folder's tokenizer as if it were its own."""
    from xformer_cli.config import Config
    from xformer_cli.data.tokenizer_plan import _tokenizer_settings

    def settings(**data) -> str:
        return _tokenizer_settings(Config(data=config_from_dict({"data": {"train": {"prefix": "m/train"},
                                                                          **data}}).data), [])

    assert settings(pairs=["en-de", "en-fr"]) != settings(pairs=["en-de", "en-fr"], sampling_temperature=5)
    assert "sampling_temperature" not in settings(pairs=["en-de", "en-fr"])  # runs made before keep theirs


def test_the_python_text_path_and_the_server_take_the_targets_own_length_penalty(monkeypatch):
    """translate_texts (what serve calls) made the options again for TextOptions' target and
    kept the alpha already filled in: de's 1.4 became the shared 0.6 (12 of 40 lines differed
    from `xformer translate -t de`). An alpha asked for stays."""
    from helpers import untrained_translator
    from xformer_cli.config import DecodeConfig
    from xformer_cli.languages import Languages
    from xformer_cli.text import TextOptions, translate_texts
    from xformer_cli.text.translation import Planner

    translator, _ = untrained_translator(DecodeConfig(beam_size=2, max_len_a=1.0, max_len_b=5, length_penalty=0.6,
                                                      length_penalty_by_target={"de": 1.4, "fr": 0.6}))
    translator.languages = Languages.of([("en", "de"), ("en", "fr")], tagged=True)
    searched = []
    monkeypatch.setattr(translator, "search", lambda lines, opts, wanted=None: searched.append(opts) or [[]] * len(lines))
    translate_texts(translator, ["a dog runs"], TextOptions(target_lang="deu"))
    translate_texts(translator, ["a dog runs"], TextOptions(target_lang="de"), translator.options(length_penalty=2.0))
    assert [(o.target_lang, o.length_penalty) for o in searched] == [("de", 1.4), ("de", 2.0)]
    # and the number words are read in the model's code for the target, whatever its spelling
    assert Planner(translator, TextOptions(target_lang=">>fra<<", keep_numbers=True), 100).numbers_lang == "fr"


def test_eval_bleus_number_accuracy_reads_any_spelling_of_the_languages():
    """-t fra or >>fra<< read French number words as 'fra' words: none found (0% against 100%
    for -t fr); --source-lang was not read at all."""
    from xformer_cli.cli.scoring import _number_languages

    assert _number_languages(None, Path("num.txt"), [Path("ref.txt")], ">>fra<<", "DEU") == ("de", "fr")
    assert _number_languages(None, Path("num.en"), [Path("ref.fr")], None) == ("en", "fr")


def test_without_py3langid_a_source_that_needs_detecting_is_asked_for_in_one_line(monkeypatch):
    import sys

    from xformer_cli import langid
    from xformer_cli.decode.direction import choose_direction
    from xformer_cli.languages import Languages

    monkeypatch.setitem(sys.modules, "py3langid", None)  # not installed
    monkeypatch.setitem(sys.modules, "py3langid.langid", None)
    monkeypatch.setattr(langid, "_identifier", None)
    langs = Languages.of([("de", "en"), ("fr", "en"), ("en", "de")], tagged=True)
    assert choose_direction(langs, "de", None).source == "en"  # one source into de: nothing to detect
    with pytest.raises(XformerError) as caught:
        choose_direction(langs, "en", None, text=lambda: "Zwei Hunde spielen im Schnee.")
    assert str(caught.value) == ("the model reads de, fr: give --source-lang, or install py3langid to detect it "
                                 "(pip install 'xformer[langid]')")


def test_eval_bleu_scores_each_direction_of_a_multilingual_checkpoint(checkpoint, tmp_path):
    result = cli("eval-bleu", "-m", checkpoint, "-b", "1", "--engine", "xformer", "--json", "-o", tmp_path / "hyp")
    assert result.exit_code == 0, result.output
    body = json.loads(result.output.strip().splitlines()[-1])
    rows = body["directions"]
    assert [r["direction"] for r in rows] == ["en->de", "en->fr"] and all(r["lines"] == 20 for r in rows)
    assert all({"BLEU", "chrF2", "off_target"} <= set(r) and r["BLEU"]["signature"].startswith("nrefs:1") for r in rows)
    assert all(0 <= r["off_target"]["rate"] <= 1 and r["off_target"]["of"] <= 20 for r in rows)
    assert (tmp_path / "hyp.en-de").is_file() and (tmp_path / "hyp.en-fr").is_file()
    table = cli("eval-bleu", "-m", checkpoint, "-b", "1", "--engine", "xformer", "-t", "fra")
    assert table.exit_code == 0, table.output
    lines = table.output.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("direction"))
    assert lines[header].split() == ["direction", "lines", "BLEU", "chrF2", "off-target"]
    assert lines[header + 1].startswith("en->fr") and not any(line.startswith("en->de") for line in lines)
