import pytest

from xformer_cli.config import CorpusConfig, load_config, validate
from xformer_cli.settings_file import parse_override
from xformer_cli.errors import XformerError

from helpers import ROOT

# What each shipped config is: model width, heads and layers, and where train / valid / test come from.
SHIPPED = {
    "multi30k.yaml": (256, 4, 3, ["/data/multi30k/train | bentrevett/multi30k", "/data/multi30k/valid | bentrevett/multi30k",
                                  "/data/multi30k/test2016 | bentrevett/multi30k"]),
    "multi30k-gpu.yaml": (256, 4, 3, ["/data/multi30k/train | bentrevett/multi30k", "/data/multi30k/valid | bentrevett/multi30k",
                                      "/data/multi30k/test2016 | bentrevett/multi30k"]),
    "wmt-news.yaml": (256, 4, 3, ["/data/wmt-news/train", "/data/wmt14/newstest2013", "/data/wmt14/newstest2014"]),
    "wmt14-en-de-base.yaml": (512, 8, 6, ["wmt14/de-en[train]", "wmt14/de-en[validation]", "wmt14/de-en[test]"]),
    "wmt14-en-de-big.yaml": (1024, 16, 6, ["wmt14/de-en[train]", "wmt14/de-en[validation]", "wmt14/de-en[test]"]),
    # three directions from one multi-parallel prefix (en -> de, fr, cs), no Hub fallback (it is en-de only)
    "multi30k-multilingual.yaml": (256, 4, 3, ["/data/multi30k/train", "/data/multi30k/valid", "/data/multi30k/test2016"]),
    # train.init_from: its model section is OPUS-MT's (the defaults here, replaced by the pretrained one)
    "finetune-opus-mt-en-de.yaml": (512, 8, 6, ["/data/multi30k/train | bentrevett/multi30k",
                                                "/data/multi30k/valid | bentrevett/multi30k",
                                                "/data/multi30k/test2016 | bentrevett/multi30k"]),
}


def where(corpus: CorpusConfig) -> str:
    """Files (and the dataset read where they are absent), or a dataset split."""
    if corpus.prefix:
        return corpus.prefix + (f" | {corpus.fallback_dataset}" if corpus.fallback_dataset else "")
    return f"{corpus.dataset}/{corpus.dataset_config}[{corpus.split}]"


# Pipeline configs (xformer pipeline; tests/test_pipeline_stages.py loads them): not training configs.
PIPELINES = ("multi30k-pipeline.yaml", "multi30k-pipeline-gpu.yaml", "pipeline-smoke.yaml")


def test_every_shipped_config_is_checked():
    assert sorted(path.name for path in (ROOT / "configs").glob("*.yaml")) == sorted([*SHIPPED, *PIPELINES])


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_configs_load_and_validation_refuses_them_broken(name, monkeypatch):
    monkeypatch.setenv("XFORMER_DATA", "/data")
    cfg = load_config(ROOT / "configs" / name)
    d_model, n_heads, layers, data = SHIPPED[name]
    assert (cfg.model.d_model, cfg.model.n_heads, cfg.model.encoder_layers, cfg.model.decoder_layers) == (
        d_model, n_heads, layers, layers)
    assert [where(corpus) for corpus in (*cfg.data.train, cfg.data.valid, cfg.data.test)] == data
    assert cfg.run_dir == f"runs/{name.removesuffix('.yaml')}"
    cfg.model.n_heads = 3  # divides none of the shipped widths
    with pytest.raises(XformerError) as info:
        validate(cfg)
    assert str(info.value) == f"config key 'model.d_model': {d_model} is not divisible by model.n_heads=3"


def test_dotted_overrides_are_typed():
    cfg = load_config("configs/multi30k.yaml", ["model.d_model=128", "train.lr_scale=2", "model.pre_norm=true", "run_dir=/tmp/x"])
    assert cfg.model.d_model == 128 and cfg.train.lr_scale == 2.0 and cfg.model.pre_norm is True
    assert cfg.run_dir == "/tmp/x"
    assert parse_override("decode.beam_size=5") == ("decode.beam_size", 5)


def test_environment_variables_expand_in_paths(monkeypatch):
    monkeypatch.setenv("XFORMER_DATA", "/corpora")
    cfg = load_config("configs/multi30k.yaml")
    assert cfg.data.train[0].prefix == "/corpora/multi30k/train"
    monkeypatch.delenv("XFORMER_DATA")
    assert load_config("configs/multi30k.yaml").data.train[0].prefix == "../shared/data/multi30k/train"
    monkeypatch.setenv("XFORMER_DATA", "")  # set but empty: the shell's :- takes the default too (it made /multi30k)
    assert load_config("configs/multi30k.yaml").data.train[0].prefix == "../shared/data/multi30k/train"
    with pytest.raises(XformerError) as info:  # a folder named "${HOME" before
        load_config("configs/multi30k.yaml", ["run_dir=${HOME/runs"])
    assert str(info.value) == "config key 'run_dir': '${HOME/runs' opens a ${VAR} it does not close"
    assert load_config("configs/multi30k.yaml", ["run_dir=runs/$5{x}"]).run_dir == "runs/$5{x}"  # no variable name


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.d_modle=256", "unknown config key 'model.d_modle' (did you mean 'model.d_model'?)"),
        ("model.n_heads=5", "config key 'model.d_model': 256 is not divisible by model.n_heads=5"),
        ("train.max_tokens=lots", "config key 'train.max_tokens': expected int or 'auto', got 'lots'"),
        ("model.dropout=1.5", "config key 'model.dropout': must be in [0, 1)"),
        ("decode.beam_size=0", "config key 'decode.beam_size': must be 1 to 256"),
        ("decode.beam_size=100000", "config key 'decode.beam_size': must be 1 to 256"),  # ran for hours
        ("decode.length_penalty=500", "config key 'decode.length_penalty': must be 0 to 10 (GNMT alpha; the paper: 0.6)"),
        ("train.tune_length_penalty=[0.6, 1000]", "config key 'train.tune_length_penalty': every alpha must be 0 to 10"),
        ("decode.max_len_b=99999999999", "config key 'decode.max_len_b': must be 0 to 10000"),  # an overflow
        ("data.train.weight=inf", "config key 'data.train.weight': must be above 0 and at most 1000 "
                                  "(1 = every pair once an epoch)"),  # an OverflowError after the tokenizer
        ("data.train.until=0", "config key 'data.train.until': must be above 0 and at most 1 (a share of the planned steps)"),
        ("data.train.until=0.5", "config key 'data.train': every corpus has an until below 1: one must train to the end"),
        ("data.valid.until=0.5", "config key 'data.valid.until': only data.train corpora take an until"),
        ("tokenizer.input_sentence_size=-1", "config key 'tokenizer.input_sentence_size': must be at least 1 "
                                             "(sentences sampled to train the tokenizer)"),
        ("tokenizer.vocab_size=99999999999999999999", "config key 'tokenizer.vocab_size': must be 16 to 1,000,000"),
        ("bogus.key=1", "unknown config key 'bogus'"),
        ("train.precision=fp64", "config key 'train.precision': must be one of auto, bf16, fp16, fp32, not 'fp64'"),
        ("train.average_last=9", "config key 'train.average_last': averages kept checkpoints: set train.keep_checkpoints to at least 9"),
        ("data.tgt_lang=no", "config key 'data.tgt_lang': expected str, got False (YAML reads no, yes, on and off "
                             "unquoted as true or false: quote the text, e.g. 'no')"),
        ("tokenizer.tgt_model=tgt.model", "config key 'tokenizer.tgt_model': the target side of tokenizer.model: give "
                                          "both (without tokenizer.model both sides are trained)"),
        ("train.length_bucket=100000", "config key 'train.length_bucket': must be 0 (off) to data.max_len + 1 (129): "
                                       "a batch's width is rounded up to a multiple of it"),
        ("model.max_positions=10000000000000", "config key 'model.max_positions': must be at most 100,000 (the table "
                                               "grows past it when a longer line comes)"),
        ("data.valid={data_files: v.tsv, split: validation}", "config key 'data.valid.split': data_files are read "
                                                               "whole, as the one split 'train' (give each split its own files)"),
        ("data.train={prefix: tr, src_column: en, tgt_column: de}", "config key 'data.train.src_column': names a column of a dataset or data "
                                     "files; plain files (prefix, src + tgt) have none"),
        ("train.average_last=1", "config key 'train.average_last': 0 (off) or at least 2: the mean of one checkpoint "
                                 "is itself"),
        ("train.dist_backend=mpi", "config key 'train.dist_backend': must be auto, nccl or gloo"),
        ("train.dist_timeout_minutes=0", "config key 'train.dist_timeout_minutes': must be positive"),
        ("train.seed=-1", "config key 'train.seed': must be 0 to 4294967295, not -1"),  # numpy's traceback before
        ("train.seed=99999999999999999999", "config key 'train.seed': must be 0 to 4294967295, "
                                            "not 99999999999999999999"),  # torch's overflow before
    ],
)
def test_bad_values_name_the_key(override, message):
    with pytest.raises(XformerError) as info:
        load_config("configs/multi30k.yaml", [override])
    assert str(info.value) == message


def test_an_odd_model_width_is_refused_before_the_first_step():
    with pytest.raises(XformerError) as info:  # a traceback from the sinusoids' table before
        load_config("configs/multi30k.yaml", ["model.d_model=33", "model.n_heads=1"])
    assert str(info.value) == "config key 'model.d_model': 33 must be even (sines and cosines take half each)"


def test_output_pieces_without_restrict_output_is_refused():
    with pytest.raises(XformerError) as info:
        load_config("configs/multi30k.yaml", ["model.restrict_output=false", "model.output_pieces=500"])
    assert str(info.value) == ("config key 'model.output_pieces': is counted by the trainer with "
                               "model.restrict_output: true; leave it out")


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(XformerError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(XformerError, match="not valid YAML"):
        load_config(bad)


def test_decode_options_are_checked_in_one_place_for_configs_and_translation():
    from xformer_cli.config import DecodeConfig
    from xformer_cli.decode.options import resolve_options

    with pytest.raises(XformerError, match="config key 'decode.max_len_b': max_len_a and max_len_b cannot both be 0"):
        load_config("configs/multi30k.yaml", overrides=["decode.max_len_a=0", "decode.max_len_b=0"])
    with pytest.raises(XformerError, match="--max-len-b: max_len_a and max_len_b cannot both be 0"):
        resolve_options(DecodeConfig(), max_len_a=0.0, max_len_b=0)
    with pytest.raises(XformerError, match="--nbest: must be between 1 and the beam size"):
        resolve_options(DecodeConfig(beam_size=2), nbest=3)
    with pytest.raises(XformerError, match="unknown decoding option"):
        resolve_options(DecodeConfig(), beam=3)
    for given, message in (({"temperature": float("nan")}, "--temperature: must be positive and finite, got nan"),
                           ({"temperature": float("inf")}, "--temperature: must be positive and finite, got inf"),
                           ({"sampling_topk": -5}, "--sampling-topk: must be k > 0 .*, got -5"),
                           ({"seed": 2**64}, "--seed: must be 0 to 4294967295, got 18446744073709551616")):
        with pytest.raises(XformerError, match=message):
            resolve_options(DecodeConfig(beam_size=1), **given)
    # what only sampling reads is refused without it, not ignored
    for given, message in (({"temperature": 0.5}, "--temperature: sets how sampling draws: use it with --sampling-topk"),
                           ({"seed": 3}, "--seed: seeds sampling's draws: use it with --sampling-topk")):
        for beam in (1, 4):
            with pytest.raises(XformerError, match=message):
                resolve_options(DecodeConfig(beam_size=beam), **given)
        assert resolve_options(DecodeConfig(beam_size=1), sampling_topk=10, **given).sampling_topk == 10


def test_a_section_given_as_a_value_is_named_whatever_the_other_overrides():
    """`--set train=5` beside an override the planned rules react to was a TypeError."""
    for overrides in (["train.tokens_per_update=3000", "train=5"], ["model.dropout=0.2", "train=5"]):
        with pytest.raises(XformerError, match=r"^config key 'train': expected a mapping of keys, got 5$"):
            load_config("configs/multi30k.yaml", overrides)


def test_target_tag_none_with_several_targets_is_refused_in_configs_and_checkpoints(tmp_path):
    """Without tags nothing tells such a model which language to write: translate -t fr did nothing
    and eval-bleu scored one output for every direction."""
    import torch
    from typer.testing import CliRunner

    from multilingual_fixture import multilingual_checkpoint, write_corpus
    from xformer_cli import Translator
    from xformer_cli.checkpoint_file import save_checkpoint
    from xformer_cli.cli import app
    from xformer_cli.config import config_from_dict

    data = {"train": {"prefix": "m/train"}, "pairs": ["en-de", "en-fr"], "target_tag": "none"}
    with pytest.raises(XformerError) as info:
        config_from_dict({"data": data})
    assert str(info.value).startswith("config key 'data.target_tag': none leaves a model of several target languages "
                                      "(de, fr)") and "\n" not in str(info.value)
    assert not config_from_dict({"data": {**data, "pairs": ["de-en", "fr-en"]}}).data.reads_tags()  # one target
    # A checkpoint of that shape, written before the check, is refused too: -t cannot be ignored.
    tagged = multilingual_checkpoint(write_corpus(tmp_path / "m"), tmp_path / "tagged.pt")
    state = torch.load(tagged, weights_only=True)
    state["config"]["data"]["target_tag"] = "none"
    untagged = save_checkpoint(state, tmp_path / "untagged.pt") or tmp_path / "untagged.pt"
    with pytest.raises(XformerError, match="config key 'data.target_tag'"):
        Translator.from_checkpoint(untagged, device="cpu")
    result = CliRunner().invoke(app, ["translate", "-m", str(untagged), "-t", "fr", "--engine", "xformer"],
                                input="A man.\n")
    assert result.exit_code == 1 and "config key 'data.target_tag'" in result.output, result.output


def test_a_rule_keyed_by_steps_takes_a_dotted_override_and_a_config_read_from_a_pipe(tmp_path):
    """--set train.dropout_by_planned_steps.3500=0.2 was 'expected int, got '3500''; a config
    given as -c <(...) or /dev/stdin was 'config file not found'."""
    import os
    import threading

    cfg = load_config("configs/multi30k.yaml", ["train.dropout_by_planned_steps.3500=0.2"])
    assert cfg.train.dropout_by_planned_steps == {3500: 0.2} and cfg.train.dropout_by_planned_epochs == {}
    fifo = tmp_path / "config.fifo"
    os.mkfifo(fifo)
    text = (ROOT / "configs" / "multi30k.yaml").read_text()
    writer = threading.Thread(target=lambda: fifo.write_text(text))
    writer.start()
    assert load_config(fifo).model.d_model == 256
    writer.join()
