"""What a hostile (or unlucky) user does to a run directory, a data file or an output path:
each ends in one line naming what is wrong, and nothing already written is lost."""

import gzip
import json
import os
from pathlib import Path

import pytest
import torch

from xformer_cli.checkpoint_file import save_checkpoint
from xformer_cli.config import load_config
from xformer_cli.errors import XformerError
from xformer_cli.fileio import atomic_file

from helpers import write_lines


def run_config(run_dir: Path, *sets: str):
    return load_config(None, [f"run_dir={run_dir}", "data.train.prefix=corpus/train", *sets])


def test_a_run_directory_without_last_pt_but_with_an_earlier_runs_checkpoints_is_refused(tmp_path):
    from xformer_cli.train.run_checkpoints import prepare_run_dir, read_last

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 5, "train_loss": 3.0}\n')
    assert read_last(run_config(run), overwrite=False) is None  # stopped before its first save: start afresh
    prepare_run_dir(run_config(run), overwrite=False)
    assert not (run / "metrics.jsonl").exists()  # ... with a log of its own, not glued to the old one
    for name in ("best.pt", "checkpoint_15.pt", "checkpoint_30.pt"):
        (run / name).write_bytes(b"x")
    with pytest.raises(XformerError, match=r"holds an earlier run \(best.pt, checkpoint_15.pt, checkpoint_30.pt\) "
                                           r"but no last.pt.*--overwrite"):
        read_last(run_config(run), overwrite=False)
    assert read_last(run_config(run), overwrite=True) is None
    save_checkpoint({"config": run_config(run).to_dict(), "model": {}}, run / "last.pt")  # an average put there
    with pytest.raises(XformerError, match=r"last.pt holds no training state to resume from \(no 'optimizer'"):
        read_last(run_config(run), overwrite=False)
    whole = {"config": run_config(run).to_dict(), "model": {}, "optimizer": {}, "schedule": {}, "rng": {}, "step": 30}
    for key, value in (("step", "30"), ("epoch", -1), ("batches_done", 2.5), ("step", True)):
        save_checkpoint({**whole, key: value}, run / "last.pt")  # edited by hand
        with pytest.raises(XformerError, match=f"last.pt: '{key}' must be a whole number, 0 or more, not "):
            read_last(run_config(run), overwrite=False)
    save_checkpoint(whole, run / "last.pt")
    assert read_last(run_config(run), overwrite=False)["step"] == 30
    afile = tmp_path / "afile"
    afile.write_text("hi")
    with pytest.raises(XformerError, match="is a file, not a directory"):
        read_last(run_config(afile), overwrite=False)


def test_a_resume_keeps_the_complete_metrics_lines_up_to_its_step(tmp_path):
    from xformer_cli.train.metrics import MetricsLog

    metrics = tmp_path / "metrics.jsonl"
    rows = [{"step": 25, "train_loss": 4.0}, {"step": 50, "valid_bleu": 1.0}, {"step": 75, "train_loss": 3.0}]
    metrics.write_text("".join(json.dumps(row) + "\n" for row in rows) + '{"step": 100, "train_lo')  # killed mid-line
    log = MetricsLog(tmp_path)
    log.keep_until(50)  # last.pt was saved at step 50: 75 and the cut line are logged again
    log.record({"step": 75, "train_loss": 2.9})
    assert [json.loads(line) for line in metrics.read_text().splitlines()] == [*rows[:2], {"step": 75, "train_loss": 2.9}]


def test_an_output_path_that_is_a_directory_a_symlink_or_an_existing_file(tmp_path):
    with pytest.raises(XformerError, match="is a directory: give a file name"):
        with atomic_file(tmp_path, "w") as handle:
            handle.write("x")
    kept = write_lines(tmp_path / "out.de", ["old"])
    os.chmod(kept, 0o640)
    link = tmp_path / "link.de"
    link.symlink_to(kept)
    with atomic_file(link, "w") as handle:
        handle.write("new\n")
    assert link.is_symlink() and kept.read_text() == "new\n"  # the link stays, its target is replaced
    assert kept.stat().st_mode & 0o777 == 0o640  # with the permissions it had
    with atomic_file(tmp_path / "fresh.de", "w") as handle:
        handle.write("x")
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "fresh.de").stat().st_mode & 0o777 == 0o666 & ~umask  # as open() makes it, not 0600


def test_an_output_that_is_an_input_is_refused_before_any_work(tmp_path):
    from xformer_cli.cli.common import check_output

    model = tmp_path / "m.pt"
    model.write_bytes(b"weights")
    source = write_lines(tmp_path / "in.en", ["A dog."])
    for output, option in ((model, "--checkpoint"), (source, "--input")):
        with pytest.raises(XformerError, match=f"is the {option} file"):
            check_output(output, [(source, "--input"), (model, "--checkpoint")])
    with pytest.raises(XformerError, match="plots are written as PNG"):
        check_output(tmp_path / "out.de", [(source, "--input")], attention=tmp_path / "a.txt")
    check_output(tmp_path / "out.de", [(source, "--input"), (model, "--checkpoint")], attention=tmp_path / "a.png")
    assert model.read_bytes() == b"weights"
    # the plot written over the translation just written, or over the glossary: both lost with exit 0 before
    glossary = write_lines(tmp_path / "g.tsv", ["dog\tHund"])
    inputs = [(source, "--input"), (glossary, "--glossary"), (model, "--checkpoint")]
    with pytest.raises(XformerError, match="--output .*g.tsv is the --glossary file"):
        check_output(glossary, inputs)
    plot = tmp_path / "a.png"  # not written yet: the same path all the same
    with pytest.raises(XformerError, match="--attention .*a.png is the --output file: write the plot elsewhere"):
        check_output(plot, inputs, attention=plot)
    check_output(None, inputs, attention=plot)  # to stdout: nothing to collide with


def _translating(**given) -> dict:
    """eval-bleu's translation options as its command hands them over: none given."""
    options = {"--output": False, "--beam-size": False, "--length-penalty": False, "--batch-size": False,
               "--engine": False, "--device": False, "--precision": False, "--threads": False}
    return {**options, **given}


def test_options_a_scoring_would_not_use_are_refused():
    from xformer_cli.cli.scoring import _check_scoring_options

    hyps = [Path("a.de")]
    _check_scoring_options(hyps, 0, "bs", _translating())
    with pytest.raises(XformerError, match="--output, --beam-size: for --checkpoint, which translates"):
        _check_scoring_options(hyps, 0, "bs", _translating(**{"--output": True, "--beam-size": True}))
    with pytest.raises(XformerError, match="^--precision, --threads: for --checkpoint, which translates"):
        _check_scoring_options(hyps, 0, "bs", _translating(**{"--precision": True, "--threads": True}))
    with pytest.raises(XformerError, match="--samples sets the paired test's resamples: give several --hyp"):
        _check_scoring_options(hyps, 100, "bs", _translating())
    _check_scoring_options(hyps * 2, 100, "bs", _translating())
    _check_scoring_options([], 0, "bs", _translating(**{"--output": True, "--beam-size": True, "--engine": True}))
    # --paired-test: a value not a test refused with one system too (it was scored, exit 0), another test alone
    with pytest.raises(XformerError, match="^--paired-test: bs \\(paired bootstrap\\) or ar \\(approximate "
                                           "randomisation\\), not 'xx'$"):
        _check_scoring_options(hyps, 0, "xx", _translating())
    with pytest.raises(XformerError, match="^--paired-test ar compares systems: give several --hyp$"):
        _check_scoring_options(hyps, 0, "ar", _translating())
    _check_scoring_options(hyps * 2, 0, "ar", _translating())


@pytest.mark.slow  # starts a process
def test_confidence_where_it_would_be_ignored_is_refused(tmp_path):
    """With several --hyp the paired test's intervals were printed, from its own resamples."""
    from helpers import assert_one_line_error, xformer

    hyp, other, ref = (write_lines(tmp_path / f"{n}.de", ["Ein Hund.", "Zwei Katzen."]) for n in ("a", "b", "r"))
    proc = xformer("eval-bleu", "--hyp", hyp, "--hyp", other, "--ref", ref, "--confidence", "50")
    assert_one_line_error(proc, "--confidence is for one system: with several --hyp the paired bootstrap")


def test_one_system_given_twice_is_refused(tmp_path):
    from xformer_cli.cli.scoring import _check_scoring_options

    hyp = write_lines(tmp_path / "h.de", ["Ein Hund."])
    (tmp_path / "link.de").symlink_to(hyp)
    with pytest.raises(XformerError, match="link.de is given twice: give each system once"):
        _check_scoring_options([hyp, tmp_path / "link.de"], 0, "bs", _translating())


def test_a_start_piece_outside_the_target_vocabulary_is_refused_naming_the_key():
    from types import SimpleNamespace

    from xformer_cli.config import load_config
    from xformer_cli.train.run_checkpoints import check_ids_fit

    tokenizer = SimpleNamespace(tgt_vocab_size=300)
    check_ids_fit(load_config("configs/multi30k.yaml", ["model.bos_id=299"]), tokenizer)
    with pytest.raises(XformerError, match="config key 'model.bos_id': 300 is not a piece of the target vocabulary "
                                           r"\(300 pieces\)"):
        check_ids_fit(load_config("configs/multi30k.yaml", ["model.bos_id=300"]), tokenizer)


@pytest.mark.parametrize("key, value, fragment", [
    ("train.adam_eps", "-1", "train.adam_eps"), ("train.adam_eps", ".nan", "train.adam_eps"),
    ("train.weight_decay", "-1", "train.weight_decay"), ("train.clip_norm", "-1", "train.clip_norm"),
    ("train.lr_scale", ".inf", "train.lr_scale"), ("data.valid_max_sentences", "-3", "data.valid_max_sentences"),
    ("run_dir", "''", "run_dir"), ("decode.length_penalty", ".nan", "decode.length_penalty"),
    ("decode.max_len_a", "-1", "decode.max_len_a"),
])
def test_impossible_numbers_are_refused_naming_their_key(key, value, fragment):
    with pytest.raises(XformerError, match=rf"config key '{fragment}'"):
        load_config(None, ["data.train.prefix=corpus/train", f"{key}={value}"])


@pytest.mark.parametrize("name", ["gpu", "cuda:x", "meta", "cpu:0"])
def test_a_device_name_torch_does_not_take_is_one_line(name):
    from xformer_cli.device import pick_device

    with pytest.raises(XformerError, match="device must be auto, cpu, cuda, cuda:N or mps"):
        pick_device(name)


def test_a_gzip_file_that_is_not_gzip_or_is_cut_off_names_the_file(tmp_path):
    from xformer_cli.data.sources import read_lines

    fake = tmp_path / "fake.en.gz"
    fake.write_bytes(b"plain text\n")
    with pytest.raises(XformerError, match=r"fake.en.gz: not a readable gzip file"):
        list(read_lines(fake))
    cut = tmp_path / "cut.en.gz"
    cut.write_bytes(gzip.compress(b"".join(b"line %d\n" % i for i in range(20000)))[:3000])
    with pytest.raises(XformerError, match=r"cut.en.gz: not a readable gzip file"):
        list(read_lines(cut))
    with pytest.raises(XformerError, match="is a directory, not a text file"):
        list(read_lines(tmp_path))


def test_a_damaged_token_cache_is_built_again(tmp_path):
    from xformer_cli.config import CorpusConfig
    from xformer_cli.data.cache import Filters, build_or_load
    from xformer_cli.data.sources import PairSource
    from xformer_cli.tokenizer import Tokenizer

    src = write_lines(tmp_path / "train.en", [f"a dog number {i} runs" for i in range(50)])
    write_lines(tmp_path / "train.de", [f"ein hund nummer {i} rennt" for i in range(50)])
    tokenizer = Tokenizer.train(src.read_text().splitlines(), (tmp_path / "train.de").read_text().splitlines(),
                                joint=True, vocab_size=60)
    sources = [PairSource(CorpusConfig(prefix=str(tmp_path / "train")), "en", "de")]
    logged = []
    cache, reused = build_or_load(sources, tokenizer, Filters(max_len=50), tmp_path / "cache", log=logged.append)
    ids = list(cache.src_ids)
    for damage in ("meta", "ids"):
        if damage == "meta":
            (cache.directory / "meta.json").write_text("{bad")
        else:
            with open(cache.directory / "src.bin", "r+b") as handle:
                handle.truncate(10)
        again, reused = build_or_load(sources, tokenizer, Filters(max_len=50), tmp_path / "cache", log=logged.append)
        assert not reused and list(again.src_ids) == ids
        assert "is damaged" in logged[-2] and "building it again" in logged[-2]


def test_average_refuses_to_write_over_an_input_or_a_runs_last_pt_and_to_mix_runs(tmp_path):
    from xformer_cli.train.average import average_checkpoints, last_checkpoints

    run = tmp_path / "run"
    run.mkdir()
    config = run_config(run).to_dict()
    for step in (10, 20):
        save_checkpoint({"config": config, "tokenizer": {"spm": b"t"}, "model": {"w": torch.full((2,), float(step))},
                         "step": step}, run / f"checkpoint_{step}.pt")
    kept = last_checkpoints(run, 2)
    with pytest.raises(XformerError, match="is the run's last.pt"):
        average_checkpoints(kept, run / "last.pt")
    with pytest.raises(XformerError, match="is one of the checkpoints to average"):
        average_checkpoints(kept, kept[1])
    os.link(kept[1], run / "last.pt")  # as a run saves it: one file under both names
    with pytest.raises(XformerError, match=f"{run / 'last.pt'} is {kept[1]} again: give each checkpoint once"):
        average_checkpoints([*kept, run / "last.pt"], tmp_path / "twice.pt")  # it would count twice
    (run / "last.pt").unlink()
    with pytest.raises(XformerError, match="--last must be at least 1"):
        last_checkpoints(run, 0)
    other = dict(config, train={**config["train"], "seed": 2})
    save_checkpoint({"config": other, "tokenizer": {"spm": b"t"}, "model": {"w": torch.zeros(2)}, "step": 5},
                    tmp_path / "other.pt")
    with pytest.raises(XformerError, match="only checkpoints of one run can be averaged"):
        average_checkpoints([kept[0], tmp_path / "other.pt"], tmp_path / "mixed.pt")
    averaged = average_checkpoints(kept, tmp_path / "average.pt")
    assert averaged["model"]["w"].tolist() == [15.0, 15.0] and not (tmp_path / "mixed.pt").exists()


def test_a_yaml_error_names_its_line_and_column_and_a_directory_is_not_called_missing(tmp_path):
    from xformer_cli.textio import iter_lines

    bad = tmp_path / "bad.yaml"
    bad.write_text("run_dir: x\nmodel:\n  d_model: 3\n   x: 1\n")
    with pytest.raises(XformerError, match=r"bad.yaml:4:5 is not valid YAML: mapping values are not allowed here"):
        load_config(bad, [])
    with pytest.raises(XformerError, match="is a directory"):
        load_config(tmp_path, [])
    with pytest.raises(XformerError, match="is a directory"):
        list(iter_lines(tmp_path))


def test_a_key_given_twice_in_a_config_is_named_not_silently_dropped(tmp_path):
    twice = tmp_path / "twice.yaml"
    twice.write_text("run_dir: x\nmodel:\n  d_model: 64\ntrain:\n  lr_scale: 2\nmodel:\n  d_ff: 128\n")
    with pytest.raises(XformerError, match=r"twice.yaml:6:1 is not valid YAML: the key 'model' is given twice "
                                           r"\(first on line 2\)$"):
        load_config(twice, [])
    merged = tmp_path / "merged.yaml"  # a YAML merge key may still be overridden, as YAML means it
    merged.write_text("base: &base {d_model: 64, n_heads: 4}\nmodel:\n  <<: *base\n  d_model: 32\n")
    from xformer_cli.settings_file import read_tree

    assert read_tree(merged)["model"] == {"d_model": 32, "n_heads": 4}


def test_a_tokenizer_model_that_is_not_one_names_its_file(tmp_path):
    from xformer_cli.tokenizer import Tokenizer

    garbage = tmp_path / "joint.model"
    garbage.write_bytes(b"not a model" * 10)
    with pytest.raises(XformerError, match=rf"^tokenizer model {garbage} is not a sentencepiece model$"):
        Tokenizer.from_files(garbage)


def test_a_file_that_fails_mid_read_names_itself_and_the_line(tmp_path, monkeypatch):
    """An I/O error while reading (a failing disk, /proc/self/mem) is one line, not a traceback."""
    import errno

    from xformer_cli.textio import iter_lines

    class Failing:
        def __iter__(self):
            yield b"A dog.\n"
            raise OSError(errno.EIO, "Input/output error")

        def close(self):
            pass

    source = write_lines(tmp_path / "in.en", ["A dog.", "A cat."])
    monkeypatch.setattr(Path, "open", lambda self, mode="r": Failing())
    with pytest.raises(XformerError, match=rf"^cannot read {source} after line 1: Input/output error$"):
        list(iter_lines(source))


def test_running_out_of_memory_in_torch_is_one_line(capsys):
    """torch's allocators raise RuntimeErrors (model.d_model=100000 on a CPU), not MemoryError."""
    import typer

    from xformer_cli.cli.common import user_errors

    @user_errors
    def command():
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 40000000000 bytes. Error code 12 (Cannot allocate memory)")

    with pytest.raises(typer.Exit) as exit_info:
        command()
    assert exit_info.value.exit_code == 1
    assert capsys.readouterr().err == ("error: out of memory; lower train.max_tokens or decode.batch_size, "
                                       "or the model's size\n")


def test_a_path_the_system_refuses_is_one_line_and_other_os_errors_stay_loud(capsys):
    """An OSError naming a path (a read-only mount a library writes into, a busy mount point
    given to --force) is one line with the path and the reason; one that names none is a bug's."""
    import errno

    import typer

    from xformer_cli.cli.common import user_errors

    @user_errors
    def refused():
        raise OSError(errno.EBUSY, "Device or resource busy", "/mnt/export")

    @user_errors
    def unnamed():
        raise OSError(errno.EBADF, "Bad file descriptor")

    with pytest.raises(typer.Exit) as exit_info:
        refused()
    assert exit_info.value.exit_code == 1
    assert capsys.readouterr().err == "error: /mnt/export: Device or resource busy\n"
    with pytest.raises(OSError):
        unnamed()


def test_a_glossary_that_is_not_utf8_names_its_line(tmp_path):
    from xformer_cli.text.glossary import load_glossary

    glossary = tmp_path / "terms.tsv"
    glossary.write_bytes(b"dog\tHund\ncaf\xe9\tCafe\n")
    with pytest.raises(XformerError, match=r"terms.tsv:2: the glossary is not UTF-8"):
        load_glossary(glossary)


def test_a_foreign_pickle_named_pt_is_one_line_without_torchs_warning(tmp_path, recwarn):
    import pickle

    from xformer_cli.checkpoint_file import load_checkpoint

    foreign = tmp_path / "foreign.pt"
    foreign.write_bytes(pickle.dumps({"a": 1}, protocol=4))
    with pytest.raises(XformerError, match="not a readable xformer checkpoint .*not a torch.save zip archive"):
        load_checkpoint(foreign)
    assert not [w for w in recwarn if "pickle protocol" in str(w.message)]


def test_a_checkpoint_whose_config_disagrees_with_its_weights_is_one_line(tmp_path):
    from xformer_cli.checkpoint_file import load_model
    from xformer_cli.tokenizer import Tokenizer

    lines = [f"a dog number {i} runs" for i in range(30)]
    tokenizer = Tokenizer.train(lines, lines, joint=True, vocab_size=40)
    config = run_config(tmp_path, "model.d_model=16", "model.d_ff=32", "model.n_heads=2", "model.encoder_layers=1",
                        "model.decoder_layers=1").to_dict()
    from xformer_cli.checkpoint_file import build_model
    from xformer_cli.config import config_from_dict

    weights = build_model(config_from_dict(config), tokenizer).state_dict()
    config["model"]["d_ff"] = 64  # the config says another shape than the weights have
    save_checkpoint({"config": config, "tokenizer": tokenizer.state(), "model": weights}, tmp_path / "m.pt")
    with pytest.raises(XformerError, match="does not match its config .*size mismatch") as caught:
        load_model(tmp_path / "m.pt")
    assert "\n" not in str(caught.value)


def test_a_byte_order_mark_is_not_text_in_any_file_read(tmp_path):
    """A glossary starting with a BOM lost its first term; a hypothesis file with one scored below
    the reference it equals; a translation input carried it into the model."""
    from xformer_cli.data.sources import read_lines
    from xformer_cli.evaluate import score_lines
    from xformer_cli.text.glossary import load_glossary
    from xformer_cli.textio import iter_lines

    bom = b"\xef\xbb\xbf"
    glossary, hyp = tmp_path / "g.tsv", tmp_path / "hyp.de"
    glossary.write_bytes(bom + "man\tMann\ndog\tHund\n".encode())
    hyp.write_bytes(bom + "Ein Mann fährt.\nZwei Hunde.\n".encode())
    assert load_glossary(glossary).terms == {"man": "Mann", "dog": "Hund"}
    lines = list(read_lines(hyp))
    assert lines == ["Ein Mann fährt.", "Zwei Hunde."] and list(iter_lines(hyp)) == lines
    assert score_lines(lines, [["Ein Mann fährt.", "Zwei Hunde."]], ("bleu",))[0].score == pytest.approx(100.0)
    hyp.write_bytes("Ein Mann.\n".encode() + bom + b"mid-file\n")  # only the file's first bytes mark it
    assert list(read_lines(hyp))[1] == "\ufeffmid-file"


def test_a_pipe_is_read_as_a_file_is(tmp_path):
    """translate -i <(...), eval-bleu --hyp <(...) and -i /dev/stdin were "input file not found"."""
    import threading

    from xformer_cli.data.sources import read_lines
    from xformer_cli.textio import iter_lines

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for read in (read_lines, iter_lines):
        writer = threading.Thread(target=lambda: fifo.write_text("A dog.\nA cat.\n", encoding="utf-8"), daemon=True)
        writer.start()
        assert list(read(fifo)) == ["A dog.", "A cat."]
        writer.join(10)
    for read in (read_lines, iter_lines):
        with pytest.raises(XformerError, match="not found"):
            list(read(tmp_path / "missing"))


def test_an_empty_side_names_both_files_and_a_folder_is_not_called_missing(tmp_path):
    """A corpus whose German side is blank was named by its English file alone (the distilled
    corpus of a model that wrote empty lines); a folder named train.de was "file not found"."""
    from helpers import pairs_sets

    from xformer_cli.data.prepare import prepare_data

    sets = pairs_sets(tmp_path, [("A dog.", ""), ("A cat.", "  ")])
    with pytest.raises(XformerError, match=f"training corpus {tmp_path / 't.en'} and {tmp_path / 't.de'} is empty"):
        prepare_data(load_config(None, sets), lambda _: None)
    (tmp_path / "t.de").unlink()
    (tmp_path / "t.de").mkdir()
    with pytest.raises(XformerError, match=f"{tmp_path / 't.de'} is a directory, not a text file"):
        prepare_data(load_config(None, sets), lambda _: None)


def test_a_command_that_sigterm_interrupts_puts_the_handler_back():
    """translate run in-process (a test, a notebook) left its SIGTERM handler behind for the rest."""
    import signal

    from xformer_cli.cli.common import interrupts_on_sigterm

    before, seen = signal.getsignal(signal.SIGTERM), []

    @interrupts_on_sigterm
    def command() -> None:
        seen.append(signal.getsignal(signal.SIGTERM))
        os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(KeyboardInterrupt):  # stopped as Ctrl-C stops it
        command()
    assert seen[0] != before and signal.getsignal(signal.SIGTERM) == before
