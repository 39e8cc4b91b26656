"""Sources, the tokenized cache and batching at scale: same pairs from every kind of source,
a cache that is reused, rebuilt and never trusted half-written, batches that keep their promises."""


import numpy as np
import pytest
from datasets import Dataset, DatasetDict

from xformer_cli.config import CorpusConfig, load_config
from xformer_cli.data import cache as cache_module
from xformer_cli.data.batching import make_batches, padding_efficiency, shard
from xformer_cli.data.cache import Filters, build_or_load
from xformer_cli.data.prepare import prepare_data
from xformer_cli.data.tokenizer_plan import sample_pairs
from xformer_cli.data.sources import PairSource
from xformer_cli.errors import XformerError
from xformer_cli.tokenizer import Tokenizer

from helpers import FsyncSpy, assert_one_line_error, head, quiet, write_lines, xformer

N = 400


@pytest.fixture(scope="module")
def pairs(multi30k):
    return list(zip(head(multi30k / "train.en", N), head(multi30k / "train.de", N)))


@pytest.fixture(scope="module")
def corpus_files(pairs, tmp_path_factory):
    """The same pairs as plain text, a saved DatasetDict, parquet, jsonl and a two-column tsv."""
    root = tmp_path_factory.mktemp("sources")
    write_lines(root / "train.en", [s for s, _ in pairs])
    write_lines(root / "train.de", [t for _, t in pairs])
    wmt = Dataset.from_dict({"translation": [{"de": t, "en": s} for s, t in pairs]})
    DatasetDict({"train": wmt, "validation": wmt.select(range(20))}).save_to_disk(str(root / "saved"))
    wmt.to_parquet(str(root / "train.parquet"))
    wmt.to_json(str(root / "train.jsonl"))
    # TSV as corpora ship it: a header, then raw text with no quoting.
    write_lines(root / "train.tsv", ["english\tgerman"] + [f"{s}\t{t}" for s, t in pairs])
    return root


@pytest.fixture(scope="module")
def tokenizer(pairs):
    return Tokenizer.train([s for s, _ in pairs], [t for _, t in pairs], joint=True, vocab_size=500)


def sources_of(root):
    return {
        "text": CorpusConfig(prefix=str(root / "train")),
        "saved": CorpusConfig(dataset=str(root / "saved")),
        "parquet": CorpusConfig(data_files=str(root / "train.parquet")),
        "jsonl": CorpusConfig(data_files=str(root / "train.jsonl")),
        "absolute glob": CorpusConfig(data_files=str(root / "train.parq*")),
        "tsv": CorpusConfig(data_files=str(root / "train.tsv"), src_column="english", tgt_column="german"),
    }


@pytest.mark.slow
def test_every_kind_of_source_gives_the_same_pairs_cache_and_batches(corpus_files, tokenizer, tmp_path, pairs):
    expected = [(s.strip(), t.strip()) for s, t in pairs]
    results = {}
    for kind, corpus in sources_of(corpus_files).items():
        source = PairSource(corpus, "en", "de")
        assert list(source) == expected, kind
        cache, _ = build_or_load([source], tokenizer, Filters(max_len=64), tmp_path / kind)
        batches = make_batches(cache.src_lens, cache.tgt_lens, 300, seed=7, epoch=1)
        results[kind] = (np.asarray(cache.src_ids).tolist(), np.asarray(cache.tgt_ids).tolist(),
                         [b.tolist() for b in batches])
    reference = results.pop("text")
    for kind, result in results.items():
        assert result == reference, kind


@pytest.mark.slow
def test_the_direction_comes_from_the_config(corpus_files, pairs):
    reverse = list(PairSource(CorpusConfig(dataset=str(corpus_files / "saved")), "de", "en"))
    assert reverse[0] == (pairs[0][1].strip(), pairs[0][0].strip())


@pytest.mark.slow
def test_cache_is_reused_without_tokenizing_and_rebuilt_on_change(corpus_files, tokenizer, tmp_path, monkeypatch):
    source = PairSource(CorpusConfig(prefix=str(corpus_files / "train")), "en", "de")
    first, reused = build_or_load([source], tokenizer, Filters(), tmp_path)
    assert not reused

    def no_tokenizing(*args, **kwargs):
        raise AssertionError("the cache was rebuilt")

    monkeypatch.setattr(cache_module, "_build", no_tokenizing)
    again, reused = build_or_load([source], tokenizer, Filters(), tmp_path)
    assert reused and again.directory == first.directory
    monkeypatch.undo()

    other_tokenizer = Tokenizer.train(["a b c d e f g h"] * 50, ["x y z w v u"] * 50, joint=True, vocab_size=40)
    changed_vocab, reused = build_or_load([source], other_tokenizer, Filters(), tmp_path)
    assert not reused and changed_vocab.directory != first.directory

    copy = tmp_path / "copy"
    copy.mkdir()
    for lang in ("en", "de"):
        (copy / f"train.{lang}").write_text((corpus_files / f"train.{lang}").read_text())
    copied = PairSource(CorpusConfig(prefix=str(copy / "train")), "en", "de")
    base, _ = build_or_load([copied], tokenizer, Filters(), tmp_path)
    with open(copy / "train.en", "a") as handle, open(copy / "train.de", "a") as other:
        handle.write("One more sentence.\n")
        other.write("Noch ein Satz.\n")
    grown, reused = build_or_load([PairSource(CorpusConfig(prefix=str(copy / "train")), "en", "de")], tokenizer, Filters(), tmp_path)
    assert not reused and len(grown) == len(base) + 1

    filtered, reused = build_or_load([source], tokenizer, Filters(max_len=20), tmp_path)
    assert not reused and len(filtered) < len(first)
    assert any("longer than 20" in reason for reason in filtered.meta["dropped"])


@pytest.mark.slow
def test_an_interrupted_build_leaves_nothing_trusted(corpus_files, tokenizer, tmp_path, monkeypatch):
    source = PairSource(CorpusConfig(prefix=str(corpus_files / "train")), "en", "de")
    real_save = np.save

    def dies_midway(path, *args, **kwargs):
        real_save(path, *args, **kwargs)
        raise KeyboardInterrupt  # as if the user pressed Ctrl-C while offsets were written

    monkeypatch.setattr(np, "save", dies_midway)
    with pytest.raises(KeyboardInterrupt):
        build_or_load([source], tokenizer, Filters(), tmp_path)
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []  # neither a finished-looking cache nor a temporary one

    # A build killed outright (no cleanup) leaves a temporary directory: never used, cleared next time.
    stale = tmp_path / f".{cache_module.fingerprint([source], tokenizer, Filters())}.building-999999"
    stale.mkdir()
    (stale / "src.bin").write_bytes(b"\x00\x01")
    cache, reused = build_or_load([source], tokenizer, Filters(), tmp_path)
    assert not reused and len(cache) == N and not stale.exists()


@pytest.mark.slow
def test_a_finished_build_is_on_disk_before_it_is_named(corpus_files, tokenizer, tmp_path, monkeypatch):
    """Every file of the build and its directory are fsynced before the rename, and the cache
    directory after it, so a power loss cannot leave a cache that looks finished but is empty."""
    spy = FsyncSpy(monkeypatch)
    source = PairSource(CorpusConfig(prefix=str(corpus_files / "train")), "en", "de")
    cache, reused = build_or_load([source], tokenizer, Filters(), tmp_path)
    root = tmp_path.resolve()
    files = {"src.bin", "tgt.bin", "src.offsets.npy", "tgt.offsets.npy", "meta.json"}
    synced = spy.calls
    staging = synced[-2][0]
    assert staging.parent == root and staging.name.startswith(".") and ".building-" in staging.name
    assert {path.name for path, _ in synced[:-2]} == files and all(path.parent == staging for path, _ in synced[:-2])
    assert synced[-2][1] == sorted(files)
    assert synced[-1] == (root, [cache.directory.name])  # the rename is synced too
    assert not reused and len(cache) == N


@pytest.mark.slow
def test_filters_count_each_reason(tmp_path, tokenizer):
    write_lines(tmp_path / "f.en", ["A dog runs.", "A dog runs.", "", "Hi", "A " + "very " * 60 + "long line."])
    write_lines(tmp_path / "f.de", ["Ein Hund rennt.", "Ein Hund rennt.", "leer", "Hallo " * 8, "Kurz."])
    source = PairSource(CorpusConfig(prefix=str(tmp_path / "f")), "en", "de")
    cache, _ = build_or_load([source], tokenizer, Filters(max_len=50, max_len_ratio=3.0, dedup=True), tmp_path / "c")
    assert len(cache) == 1
    assert cache.meta["dropped"] == {"duplicate": 1, "empty side": 1, "length ratio above 3": 1, "longer than 50 pieces": 1}


@pytest.mark.slow
def test_tokenizer_sample_is_bounded_and_seeded(corpus_files):
    source = PairSource(CorpusConfig(prefix=str(corpus_files / "train")), "en", "de")
    a, b = sample_pairs([source], 50, seed=3), sample_pairs([source], 50, seed=3)
    assert len(a) == 50 and a == b and a != sample_pairs([source], 50, seed=4)
    assert set(a) <= set(source)


def test_batches_are_bounded_complete_seeded_and_shardable():
    rng = np.random.default_rng(0)
    src = rng.integers(1, 80, 20000)
    tgt = np.clip(src + rng.integers(-4, 5, 20000), 1, None)  # lengths correlate, as in real parallel text
    batches = make_batches(src, tgt, 4096, seed=5, epoch=3)
    assert all(len(b) * (max(src[b].max(), tgt[b].max()) + 1) <= 4096 for b in batches)
    assert np.array_equal(np.sort(np.concatenate(batches)), np.arange(20000))
    assert padding_efficiency(batches, src, tgt) > 0.9
    again = make_batches(src, tgt, 4096, seed=5, epoch=3)
    assert all(np.array_equal(x, y) for x, y in zip(batches, again))
    shards = [shard(batches, rank, 3) for rank in range(3)]
    flat = [np.concatenate(s) for s in shards]
    assert sum(len(f) for f in flat) == 20000
    assert len(set(np.concatenate(flat).tolist())) == 20000  # disjoint and complete


@pytest.mark.slow
def test_prepare_never_writes_another_tokenizer_over_a_trained_runs(trained_run, small_corpus, tmp_path):
    """prepare with other tokenizer settings in a run folder that has trained replaced its
    tokenizer (600 pieces under a 1000-piece model); train refuses those settings there."""
    import shutil

    from helpers import tiny_config
    from xformer_cli.train.run_checkpoints import trained_tokenizer_check

    run = shutil.copytree(trained_run, tmp_path / "run")
    before = {p.name: p.read_bytes() for p in (run / "tokenizer").iterdir()}
    changed = tiny_config(small_corpus, run, **{"tokenizer.vocab_size": 600})
    with pytest.raises(XformerError, match="last.pt was trained with another tokenizer than these settings give, "
                                           "which prepare would write over the run's; use another run_dir"):
        prepare_data(changed, quiet, keep=trained_tokenizer_check(changed))
    assert {p.name: p.read_bytes() for p in (run / "tokenizer").iterdir()} == before
    same = tiny_config(small_corpus, run)
    assert prepare_data(same, quiet, keep=trained_tokenizer_check(same)).cache_reused  # its own settings: as before


@pytest.mark.slow
def test_prepare_command_then_train_reuses_tokenizer_and_cache(corpus_files, tmp_path):
    run_dir = tmp_path / "run"
    sets = ["--set", f"run_dir={run_dir}", "--set", f"data.train={{dataset: {corpus_files / 'saved'}}}",
            "--set", "data.valid=null", "--set", "data.test=null", "--set", "tokenizer.vocab_size=300"]
    proc = xformer("prepare", "-c", "configs/multi30k.yaml", *sets)
    assert proc.returncode == 0, proc.stderr.decode()
    assert f"({N} pairs" in proc.stdout.decode() and "built" in proc.stdout.decode()
    cfg = load_config("configs/multi30k.yaml", [s for s in sets if s != "--set"])
    logs = []
    prepared = prepare_data(cfg, logs.append)
    assert prepared.cache_reused
    assert any("tokenizer: reusing" in line for line in logs)


@pytest.mark.slow
def test_bad_dataset_inputs(corpus_files, tmp_path):
    base = ["train", "-c", "configs/multi30k.yaml", "--set", f"run_dir={tmp_path / 'run'}", "--set", "data.valid=null",
            "--set", "data.test=null", "--set", "data.train.prefix=null"]
    saved = corpus_files / "saved"
    assert_one_line_error(xformer(*base, "--set", f"data.train.dataset={saved}", "--set", "data.tgt_lang=fr"),
                          "no 'fr' in its translation column", "languages: de, en")
    assert_one_line_error(xformer(*base, "--set", f"data.train.dataset={saved}", "--set", "data.train.split=dev"),
                          "has no split 'dev'", "splits: train, validation")
    assert_one_line_error(xformer(*base, "--set", f"data.train.data_files={tmp_path / 'none.parquet'}"), "data files not found")
    assert_one_line_error(xformer(*base, "--set", f"data.train.data_files={corpus_files / 'train.tsv'}"),
                          "no 'translation' column", "columns: english, german")
    assert_one_line_error(xformer(*base, "--set", f"data.train.prefix={corpus_files / 'train'}", "--set", "data.max_len=1"),
                          "nothing left to train on", "longer than 1 pieces")
    assert not (tmp_path / "run" / "last.pt").exists()


def test_invalid_utf8_can_be_skipped_and_counted(tmp_path):
    (tmp_path / "u.en").write_bytes(b"good one\nbad \xff one\ngood two\n")
    write_lines(tmp_path / "u.de", ["gut eins", "schlecht", "gut zwei"])
    with pytest.raises(XformerError, match=r"u.en:2: invalid UTF-8"):
        list(PairSource(CorpusConfig(prefix=str(tmp_path / "u")), "en", "de"))
    source = PairSource(CorpusConfig(prefix=str(tmp_path / "u")), "en", "de", skip_invalid=True)
    assert list(source) == [("good one", "gut eins"), ("good two", "gut zwei")]
    assert source.dropped == {"invalid UTF-8": 1}


@pytest.mark.slow
def test_a_vocabulary_larger_than_the_data_allows_is_one_warning_line(corpus_files, tmp_path):
    sets = ["--set", f"run_dir={tmp_path / 'run'}", "--set", f"data.train={{dataset: {corpus_files / 'saved'}}}",
            "--set", "data.valid=null", "--set", "data.test=null", "--set", "tokenizer.vocab_size=200000"]
    proc = xformer("prepare", "-c", "configs/multi30k.yaml", *sets)
    assert proc.returncode == 0, proc.stderr.decode()
    warnings = [line for line in proc.stderr.decode().splitlines() if line.startswith("warning: tokenizer.vocab_size")]
    assert len(warnings) == 1
    got = int(warnings[0].split("got ")[1].split(":")[0])
    assert 16 < got < 200000 and "asked for 200000 pieces" in warnings[0]


@pytest.mark.slow
def test_missing_local_files_fall_back_to_the_configured_dataset(pairs, tmp_path):
    """The shipped Multi30k config names bentrevett/multi30k (columns en/de, splits train /
    validation / test) for machines without the local files; here a save_to_disk copy in that
    schema stands in for the Hub."""
    hub_copy = tmp_path / "multi30k-hub"
    columns = lambda rows: Dataset.from_dict({"en": [s for s, _ in rows], "de": [t for _, t in rows]})  # noqa: E731
    DatasetDict({"train": columns(pairs), "validation": columns(pairs[:30]), "test": columns(pairs[30:60])}).save_to_disk(str(hub_copy))
    missing = tmp_path / "nowhere" / "multi30k"
    cfg = load_config("configs/multi30k.yaml", [
        f"run_dir={tmp_path / 'run'}", "tokenizer.vocab_size=300",
        *[f"data.{role}={{prefix: {missing}/{name}, fallback_dataset: {hub_copy}}}"
          for role, name in (("train", "train"), ("valid", "valid"), ("test", "test2016"))],
    ])
    logs: list[str] = []
    prepared = prepare_data(cfg, logs.append)
    notices = [line for line in logs if line.startswith("data: ")]
    assert notices == [f"data: {missing}/{name}.en not found; reading {hub_copy}[{split}] through Hugging Face datasets instead"
                       for name, split in (("train", "train"), ("valid", "validation"), ("test2016", "test"))]
    assert prepared.train.meta["pairs"] == N
    assert prepared.valid.src == [s for s, _ in pairs[:30]] and prepared.test.tgt == [t for _, t in pairs[30:60]]


@pytest.mark.slow
def test_neither_local_files_nor_the_hub_is_one_line_saying_where_to_point(tmp_path):
    proc = xformer("prepare", "-c", "configs/multi30k.yaml", "--set", f"run_dir={tmp_path / 'run'}",
                   "--set", f"data.train.prefix={tmp_path}/absent/train",
                   python_prelude="import os; os.environ['HF_HUB_OFFLINE'] = '1'; os.environ['HF_DATASETS_OFFLINE'] = '1'")
    assert_one_line_error(proc, f"{tmp_path}/absent/train.en not found", "bentrevett/multi30k", "XFORMER_DATA")
    assert not (tmp_path / "run").exists()
