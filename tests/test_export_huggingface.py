"""Hugging Face export: transformers loads it as a MarianMT model that computes what xformer does."""

import errno
import json
import sys

import pytest
import torch

from xformer_cli.checkpoint_file import load_model
from xformer_cli.config import DecodeConfig
from xformer_cli.data.batching import encode_source_batch, pad
from xformer_cli.decode.translator import Translator
from xformer_cli.errors import XformerError
from xformer_cli.export import huggingface as export_module
from xformer_cli.export.huggingface import MISSING_HF, export_huggingface, xformer_max_new_tokens
from xformer_cli.tokenizer import BOS_ID, EOS_ID, PAD_ID

from helpers import assert_one_line_error, head, tiny_checkpoint, xformer

from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, GenerationConfig, MarianMTModel, MarianTokenizer  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

pytestmark = [
    pytest.mark.slow,  # every test exports a model built from Multi30k pairs
    # MarianTokenizer asks for sacremoses, which only its unused normalize() would call.
    pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses"),
]

N_TRAIN = 30  # memorised pairs: confident, real German outputs
N_UNSEEN = 12  # unseen test sentences: the model's guesses, decoded identically all the same
DECODE = DecodeConfig(beam_size=4, length_penalty=0.6, max_len_a=1.2, max_len_b=10)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Two torch threads on two busy cores spin far more than they compute."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    hf_logging.disable_progress_bar()
    yield
    torch.set_num_threads(before)


def _pairs(multi30k):
    src = head(multi30k / "train.en", N_TRAIN)
    return src, [t.strip() for t in head(multi30k / "train.de", N_TRAIN)]


def _checkpoint(multi30k, path, joint=True, tie=True, pre_norm=False, steps=0, layers=2, restrict=False):
    return tiny_checkpoint(multi30k, path, pairs=N_TRAIN, steps=steps, joint=joint, tie=tie, pre_norm=pre_norm,
                           layers=layers, decode=DECODE, restrict=restrict)


@pytest.fixture(scope="module")
def trained(multi30k, tmp_path_factory):
    """A memorising model, its export, and real Multi30k lines (seen and unseen). One layer
    each side and 60 steps: every training pair memorised, some unseen lines cut at the limit."""
    root = tmp_path_factory.mktemp("hf-trained")
    checkpoint = _checkpoint(multi30k, root / "best.pt", steps=60, layers=1)
    sentences = _pairs(multi30k)[0] + head(multi30k / "test2016.en", N_UNSEEN)
    return checkpoint, export_huggingface(checkpoint, root / "hf"), sentences


@pytest.fixture(scope="module")
def trained_restricted(multi30k, tmp_path_factory):
    """The same, its output layer over the target side's pieces (model.restrict_output): the
    others go out as -inf in final_logits_bias."""
    root = tmp_path_factory.mktemp("hf-trained-restricted")
    checkpoint = _checkpoint(multi30k, root / "best.pt", steps=60, layers=1, restrict=True)
    sentences = _pairs(multi30k)[0] + head(multi30k / "test2016.en", N_UNSEEN)
    return checkpoint, export_huggingface(checkpoint, root / "hf"), sentences


@pytest.fixture(scope="module")
def trained_pre_norm(multi30k, tmp_path_factory):
    """The same, pre-norm: exported as Pegasus."""
    root = tmp_path_factory.mktemp("hf-trained-pre-norm")
    checkpoint = _checkpoint(multi30k, root / "best.pt", steps=60, layers=1, pre_norm=True)
    sentences = _pairs(multi30k)[0] + head(multi30k / "test2016.en", N_UNSEEN)
    return checkpoint, export_huggingface(checkpoint, root / "hf"), sentences


@pytest.mark.parametrize("joint,tie,pre_norm,restrict", [(True, True, False, False), (False, True, False, False),
                                                         (True, False, False, False), (False, False, False, False),
                                                         (True, True, True, False), (True, True, False, True)],
                         ids=["joint-tied", "separate-tied", "joint-untied", "separate-untied", "pre-norm", "restricted"])
def test_logits_equal_xformer(multi30k, tmp_path, joint, tie, pre_norm, restrict):
    checkpoint = _checkpoint(multi30k, tmp_path / "model.pt", joint=joint, tie=tie, pre_norm=pre_norm, restrict=restrict)
    out = export_huggingface(checkpoint, tmp_path / "hf")
    model, tokenizer, _ = load_model(checkpoint)
    hf, loading = AutoModelForSeq2SeqLM.from_pretrained(out, output_loading_info=True)
    hf.eval()
    assert not any(loading.values()), loading  # every weight from the file (Pegasus's sinusoid tables too)
    hf_tokenizer = AutoTokenizer.from_pretrained(out)
    assert type(hf_tokenizer).__name__ == "MarianTokenizer"
    if pre_norm:  # Marian's layers with pre-norm and a final LayerNorm per stack: Pegasus
        assert type(hf).__name__ == "PegasusForConditionalGeneration" and hf.config.vocab_size == tokenizer.src_vocab_size
        # the final LayerNorms carry xformer's (not their initial ones and zeros)
        assert not torch.allclose(hf.model.encoder.layer_norm.weight, torch.ones(hf.config.d_model))
    else:
        assert type(hf) is MarianMTModel and hf.config.share_encoder_decoder_embeddings == (joint and tie)
        assert hf.config.vocab_size == tokenizer.src_vocab_size and hf.config.decoder_vocab_size == tokenizer.tgt_vocab_size

    src, tgt = _pairs(multi30k)
    src = src[:4] + head(multi30k / "test2016.en", 4)  # unseen lines too (unknown pieces, other lengths)
    tgt = tgt[:4] + head(multi30k / "test2016.de", 4)
    batch = hf_tokenizer(src, text_target=tgt, padding=True, return_tensors="pt")
    # MarianTokenizer gives xformer's ids: source pieces + eos, target pieces + eos, pad 0.
    assert torch.equal(batch["input_ids"], encode_source_batch(tokenizer.encode_src(src)))
    assert torch.equal(batch["labels"], pad(tokenizer.encode_tgt(tgt), suffix=(EOS_ID,)))
    tgt_in = pad(tokenizer.encode_tgt(tgt), prefix=(BOS_ID,))
    with torch.no_grad():
        ours = model(batch["input_ids"], tgt_in)
        theirs = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], decoder_input_ids=tgt_in,
                    decoder_attention_mask=(tgt_in != PAD_ID).long()).logits
    real = tgt_in != PAD_ID
    assert ours.abs().max() > 1.0  # not trivially equal
    if restrict:  # ours: the scored pieces' columns; the export gives every other piece -inf
        scored = torch.zeros(theirs.size(-1), dtype=torch.bool).index_fill_(0, model.output_pieces, True)
        assert ours.size(-1) == model.cfg.output_pieces < theirs.size(-1)
        assert torch.isneginf(theirs[..., ~scored]).all()
        theirs = theirs[..., scored]
    torch.testing.assert_close(theirs[real], ours[real], atol=1e-4, rtol=1e-4)
    # Detokenization: the target's pieces come back as xformer's text.
    assert hf_tokenizer.batch_decode(batch["labels"], skip_special_tokens=True) == tokenizer.decode_tgt(tokenizer.encode_tgt(tgt))


def test_files_and_generation_settings(trained):
    _, out, _ = trained
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "source.spm", "target.spm", "vocab.json",
            "tokenizer_config.json", "xformer_export.json"} <= names
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no staging directory left
    generation = GenerationConfig.from_pretrained(out)
    assert (generation.decoder_start_token_id, generation.eos_token_id, generation.pad_token_id,
            generation.forced_eos_token_id) == (BOS_ID, EOS_ID, PAD_ID, EOS_ID)
    assert generation.num_beams == DECODE.beam_size and generation.early_stopping == "never"
    assert generation.max_new_tokens == xformer_max_new_tokens(257, DECODE.max_len_a, DECODE.max_len_b)  # 256 + eos
    assert generation.min_new_tokens == 1 and sorted(generation.suppress_tokens) == [PAD_ID, BOS_ID]
    assert json.loads((out / "tokenizer_config.json").read_text())["clean_up_tokenization_spaces"] is False
    vocab = json.loads((out / "vocab.json").read_text())
    assert vocab["<pad>"] == PAD_ID and vocab["</s>"] == EOS_ID and vocab["<s>"] == BOS_ID


@pytest.mark.parametrize("which", ["trained", "trained_pre_norm", "trained_restricted"])
def test_greedy_generate_equals_xformer(which, request):
    checkpoint, out, sentences = request.getfixturevalue(which)
    translator = Translator.from_checkpoint(checkpoint, device="cpu")
    hyps = [h for (h,) in translator.search(sentences, translator.options(beam_size=1))]
    expected = [translator.detokenize(h) for h in hyps]
    model, loading = AutoModelForSeq2SeqLM.from_pretrained(out, output_loading_info=True)
    model.eval()
    assert not any(loading.values()), loading  # no "MISSING ... newly initialized" in the load report
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert type(model).__name__ == ("PegasusForConditionalGeneration" if which == "trained_pre_norm" else "MarianMTModel")
    encoded = tokenizer(sentences)["input_ids"]
    by_length = {}
    for i, ids in enumerate(encoded):
        by_length.setdefault(len(ids), []).append(i)
    got, tokens, limits = [None] * len(sentences), [None] * len(sentences), [0] * len(sentences)
    for length, rows in by_length.items():  # equal source lengths share xformer's length limit
        limit = xformer_max_new_tokens(length, DECODE.max_len_a, DECODE.max_len_b)
        input_ids = torch.tensor([encoded[i] for i in rows])
        with torch.no_grad():
            ids = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), num_beams=1,
                                 max_new_tokens=limit)
        for i, row, text in zip(rows, ids.tolist(), tokenizer.batch_decode(ids, skip_special_tokens=True)):
            got[i], limits[i] = text, limit - 1
            tokens[i] = [t for t in row[1:] if t not in (EOS_ID, PAD_ID)]  # less the start token, eos, padding
    assert tokens == [h.tokens for h in hyps]  # the same pieces, those cut at the length limit included
    assert any(len(h.tokens) == n for h, n in zip(hyps, limits))  # (some are cut there)
    # The same text, except that MarianTokenizer strips the spaces around it: a translation
    # that ends in a lone "▁" piece (a barely trained model's babble can) loses its final
    # space, which sentencepiece, and so xformer, keeps.
    assert got == [e.strip() for e in expected]
    assert sum(line in expected[:N_TRAIN] for line in got) > N_TRAIN // 2  # outputs are real, varied German
    assert len(set(got)) > N_TRAIN // 2

    # A padded batch with the generation config's own (longest-source) limit: the same
    # for every line that ends before the shortest line's limit, here all the memorised ones.
    inputs = tokenizer(sentences[:N_TRAIN], return_tensors="pt", padding=True)
    with torch.no_grad():
        batch = tokenizer.batch_decode(model.generate(**inputs, num_beams=1), skip_special_tokens=True)
    assert batch == expected[:N_TRAIN]

    # Beam search: Hugging Face's length penalty is not GNMT's, so close rather than equal.
    with torch.no_grad():
        beam = tokenizer.batch_decode(model.generate(**inputs), skip_special_tokens=True)
    xformer_beam = translator.translate(sentences[:N_TRAIN])
    assert sum(a == b for a, b in zip(beam, xformer_beam)) >= 0.9 * N_TRAIN


def test_pre_norm_model_with_separate_embeddings_is_refused_with_one_line(multi30k, tmp_path):
    checkpoint = _checkpoint(multi30k, tmp_path / "pre.pt", pre_norm=True, joint=False)
    proc = xformer("export", "--format", "huggingface", "-m", checkpoint, "-o", tmp_path / "hf")
    assert_one_line_error(proc, "cannot export to Hugging Face", "pre-norm", "separate", "Pegasus")
    assert not (tmp_path / "hf").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["pre.pt"]
    proc = xformer("export", "--format", "onnx", "-m", checkpoint, "-o", tmp_path / "hf")
    assert_one_line_error(proc, "--format must be ctranslate2 or huggingface")


def test_non_empty_output_needs_force(trained, tmp_path):
    checkpoint, _, _ = trained
    target = tmp_path / "model"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    proc = xformer("export", "--format", "huggingface", "-m", checkpoint, "-o", target)
    assert_one_line_error(proc, "not empty", "--force")
    assert [p.name for p in target.iterdir()] == ["keep.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["model"]

    proc = xformer("export", "--format", "huggingface", "-m", checkpoint, "-o", target, "--force")
    assert_one_line_error(proc, "not an xformer export", "--force replaces an earlier export only")
    assert [p.name for p in target.iterdir()] == ["keep.txt"]

    (target / "keep.txt").unlink()
    export_huggingface(checkpoint, target)
    (target / "notes.txt").write_text("mine")
    with pytest.raises(XformerError, match="holds notes.txt beside an earlier export: --force replaces the export only"):
        export_huggingface(checkpoint, target, force=True)
    (target / "notes.txt").unlink()
    (target / "model.safetensors").write_bytes(b"an earlier export's")
    export_huggingface(checkpoint, target, force=True)
    assert (target / "model.safetensors").read_bytes() != b"an earlier export's"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
    help_text = " ".join(xformer("export", "--help").stdout.decode().split())
    assert "pip install 'xformer[hf]'" in help_text and "pip install 'xformer[ctranslate2]'" in help_text


def test_missing_transformers_is_a_clear_error(trained, tmp_path, monkeypatch):
    checkpoint, _, _ = trained
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    with pytest.raises(XformerError) as info:
        export_huggingface(checkpoint, tmp_path / "out")
    assert str(info.value) == MISSING_HF
    assert not (tmp_path / "out").exists()


def test_a_full_disk_keeps_the_previous_export(trained, tmp_path, monkeypatch):
    checkpoint, _, _ = trained
    target = export_huggingface(checkpoint, tmp_path / "hf")
    before = {p.name: p.read_bytes() for p in target.iterdir()}

    def full(path, data):
        with open(path, "wb") as handle:
            handle.write(data[:100])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(export_module, "_write_weights", full)
    with pytest.raises(XformerError, match="no space left on device") as info:
        export_huggingface(checkpoint, target, force=True)
    assert "previous hf is unchanged" in str(info.value) and "\n" not in str(info.value)
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]  # no staging directory left
