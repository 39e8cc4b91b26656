"""`xformer pipeline`'s parts without a corpus: the resumable corpus translation, the stage
records (skip, resume, redo), the monolingual reader, the config, and the corpus tag."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from helpers import ROOT, write_lines
from xformer_cli.config import CorpusConfig, load_config
from xformer_cli.errors import XformerError
from xformer_cli.pipeline import STAGES, load_pipeline_config
from xformer_cli.pipeline.corpus_translation import CorpusJob, TextLines, complete_lines, translate_corpus
from xformer_cli.pipeline.record import StageRecord, at_home, fingerprint, from_home
from xformer_cli.pipeline import checks, earlier_forms, runner
from xformer_cli.pipeline.runner import _chosen, run_stage
from xformer_cli.pipeline.stages import Pipeline
from xformer_cli.tokenizer import Tokenizer


def fake_translate(chunk: list[str], index: int) -> list[str]:
    """Depends on the chunk's index and on its lines: a resume that cut chunks elsewhere differs."""
    return [f"{line[::-1]} #{index}/{len(chunk)}" for line in chunk]


def job_in(folder: Path, lines: list[str], chunk: int = 3) -> CorpusJob:
    return CorpusJob(lines, folder / "in.txt", folder / "out.txt", len(lines), chunk)


def test_a_killed_translation_resumes_to_the_uninterrupted_output(tmp_path):
    lines = [f"line {i}" for i in range(11)]
    whole = tmp_path / "whole"
    whole.mkdir()
    assert translate_corpus(job_in(whole, lines), fake_translate, lambda _: None, progress=False) == 11

    cut = tmp_path / "cut"
    cut.mkdir()
    calls = []

    def dies_on_third_chunk(chunk, index):
        calls.append(index)
        if len(calls) == 3:
            raise KeyboardInterrupt  # killed while chunk 2 is being translated
        return fake_translate(chunk, index)

    with pytest.raises(KeyboardInterrupt):
        translate_corpus(job_in(cut, lines), dies_on_third_chunk, lambda _: None, progress=False)
    # a kill in the middle of a write: half a line in one file, a whole extra chunk in the other
    with open(cut / "out.txt", "ab") as f:
        f.write("half a transl".encode())
    with open(cut / "in.txt", "ab") as f:
        f.write(b"line 6\nline 7\nline 8\n")
    said = []
    assert translate_corpus(job_in(cut, lines), fake_translate, said.append, progress=False) == 11
    assert said[0].startswith("resuming after line 6")
    for name in ("in.txt", "out.txt"):
        assert (cut / name).read_bytes() == (whole / name).read_bytes()
    assert complete_lines(cut / "out.txt") == len(lines)


def test_a_full_disk_mid_translation_is_one_line_and_keeps_the_whole_chunks(tmp_path, monkeypatch):
    import os

    lines = [f"line {i}" for i in range(7)]
    syncs = []
    real_fsync = os.fsync

    def full_from_the_third_sync(fd):  # chunk 0's two files synced, then the disk is full
        syncs.append(fd)
        if len(syncs) >= 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", full_from_the_third_sync)
    with pytest.raises(XformerError) as failure:
        translate_corpus(job_in(tmp_path, lines), fake_translate, lambda _: None, progress=False)
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert "no space left" in str(failure.value) and "\n" not in str(failure.value)
    assert "out.txt" in str(failure.value) or "in.txt" in str(failure.value)
    said = []
    assert translate_corpus(job_in(tmp_path, lines), fake_translate, said.append, progress=False) == 7
    assert said[0].startswith("resuming after line 3")  # chunk 0 kept, chunk 1 done again
    assert (tmp_path / "out.txt").read_text().splitlines() == fake_translate(lines[:3], 0) + \
        fake_translate(lines[3:6], 1) + fake_translate(lines[6:], 2)


def test_a_write_the_full_disk_refuses_keeps_its_line(tmp_path, monkeypatch):
    """The disk full at a write (not at the sync): a buffered file tried the bytes again on close,
    and that second OSError replaced the line naming the file and the resume point."""
    import io
    import os
    import pathlib

    lines = [f"line {i}" for i in range(7)]
    job = job_in(tmp_path, lines)
    real_open = pathlib.Path.open

    class FullAfterOneChunk(io.FileIO):
        def write(self, data):
            if self.tell() > 0:
                raise OSError(errno.ENOSPC, "No space left on device")
            return super().write(data)

    def opened(path, mode="r", buffering=-1, **kwargs):
        if path != job.outputs_path:
            return real_open(path, mode, buffering, **kwargs)
        raw = FullAfterOneChunk(os.fspath(path), mode.replace("b", ""))
        return raw if buffering == 0 else io.BufferedWriter(raw)

    monkeypatch.setattr(pathlib.Path, "open", opened)
    with pytest.raises(XformerError, match=r"out.txt.*no space left.*the lines before 4 \(a rerun resumes there\)"):
        translate_corpus(job, fake_translate, lambda _: None, progress=False)
    monkeypatch.setattr(pathlib.Path, "open", real_open)
    assert translate_corpus(job_in(tmp_path, lines), fake_translate, lambda _: None, progress=False) == 7


def test_translations_with_line_breaks_stay_one_line(tmp_path):
    job = job_in(tmp_path, ["a", "b"], chunk=2)
    translate_corpus(job, lambda chunk, i: ["x\ny", "z"], lambda _: None, progress=False)
    assert (tmp_path / "out.txt").read_text().splitlines() == ["x y", "z"]


def test_the_translated_corpus_says_how_many_source_numbers_it_kept(tmp_path):
    from xformer_cli.pipeline.corpus_translation import numbers_kept

    lines = ["2 dogs run.", "A man with 1102 balloons.", "A cat sleeps.", "3 men and 40 women."]
    outputs = ["Zwei Hunde rennen.", "Ein Mann mit 110 Ballons.", "Eine Katze schläft.", "3 Männer und Frauen."]
    job = job_in(tmp_path, lines, chunk=2)
    translate_corpus(job, lambda chunk, i: outputs[2 * i:2 * i + len(chunk)], lambda _: None, progress=False)
    kept = numbers_kept(job, "en", "de")
    assert (kept.kept, kept.total, kept.lines) == (2, 4, 3)  # "1102" and "40" lost


def test_monolingual_text_skips_empty_lines_and_names_bad_bytes(tmp_path):
    path = tmp_path / "mono.de"
    path.write_bytes(b"eins\n\n  \nzwei\n\xff kaputt\ndrei\n")
    with pytest.raises(XformerError, match=r"mono.de:5: invalid UTF-8.*mono.skip_invalid_utf8"):
        list(TextLines(path))
    skipping = TextLines(path, skip_invalid=True)
    assert list(skipping) == ["eins", "zwei", "drei"]
    assert skipping.dropped == {"empty": 2, "invalid UTF-8": 1}
    assert list(TextLines(path, skip_invalid=True, max_lines=2)) == ["eins", "zwei"]


def test_a_stage_record_skips_resumes_or_starts_over(tmp_path):
    record = StageRecord("teacher", tmp_path / "teacher")
    assert record.begin("a") is False  # nothing there: a fresh start
    (record.directory / "last.pt").write_text("partial")
    assert record.begin("a") is True  # same inputs, unfinished: resume, files kept
    assert (record.directory / "last.pt").exists()
    record.finish("a", model="m")
    assert record.done_with("a") and not record.done_with("b")
    assert record.begin("b") is False  # other inputs: a fresh folder, the finished one set aside
    assert not (record.directory / "last.pt").exists() and (record.replaced / "last.pt").exists()
    record.finish("b")
    record.drop_replaced()
    assert not record.replaced.exists()
    assert record.begin("b") is False and not record.done_with("b")  # a redo of the finished one: set aside
    record.path.write_text("{ cut")  # a damaged record is a stage to do again
    assert record.read() is None and not record.done_with("b")
    record.path.write_text('{"done": true, "stage": "teacher"}')  # JSON without its fingerprint: a KeyError before
    assert record.read() is None and not record.done_with("b")


class FakeStage:
    """A stage whose inputs the test sets and whose body writes a file or fails."""

    def __init__(self, monkeypatch, pipe: Pipeline):
        self.inputs, self.fails = "a", None
        monkeypatch.setitem(runner.FINGERPRINTS, "reverse", lambda _: self.inputs)
        monkeypatch.setitem(runner.RUNS, "reverse", self.body)
        self.folder = pipe.record("reverse").directory

    def body(self, _pipe) -> dict:
        (self.folder / "made").write_text(f"made of {self.inputs}")
        if self.fails is not None:
            raise self.fails
        return {"model": str(self.folder / "made")}


def test_a_finished_stage_whose_output_is_gone_runs_again_and_the_status_says_so(tmp_path, monkeypatch):
    """A deleted student best.pt left the stage 'skipped' and export failing on 'checkpoint not found'."""
    from xformer_cli.pipeline import run_pipeline
    from xformer_cli.pipeline.status import stage_statuses

    said: list[str] = []
    write_lines(tmp_path / "mono.de", ["Ein Hund läuft."] * 3)
    config = smoke(tmp_path, f"mono.target={tmp_path / 'mono.de'}")
    pipe = Pipeline(config, log=said.append, progress=False)
    stage = FakeStage(monkeypatch, pipe)
    first = run_stage(pipe, "reverse")
    assert [s.action for s in stage_statuses(pipe) if s.stage == "reverse"] == ["skipped"]
    (stage.folder / "made").unlink()
    with pytest.raises(XformerError, match=f"^pipeline stage reverse made {re.escape(str(stage.folder / 'made'))}, "
                                           r"which is gone: run it again \(xformer pipeline -c CONFIG --from reverse\)$"):
        run_pipeline(config, only="backtranslate", log=lambda _: None, progress=False)  # it would not visit reverse
    status = next(s for s in stage_statuses(pipe) if s.stage == "reverse")
    assert (status.action, status.detail) == ("redone", f"{stage.folder / 'made'} is gone: runs again")
    again = run_stage(pipe, "reverse")
    assert (stage.folder / "made").read_text() == "made of a" and again["finished"] >= first["finished"]
    assert f"stage reverse: its record names {stage.folder / 'made'}, which is gone: the stage runs again" in said


def test_a_reverse_model_given_as_an_export_folder_is_stamped_by_its_files(tmp_path):
    """It was refused as "file not found" (a file's stamp of a folder); backtranslate runs exports."""
    from xformer_cli.pipeline.stages import FINGERPRINTS

    exported = tmp_path / "rev-ct2"
    exported.mkdir()
    (exported / "xformer_export.json").write_text("{}")
    (exported / "model.bin").write_bytes(b"weights")
    pipe = Pipeline(smoke(tmp_path, f"reverse.checkpoint={exported}"), log=lambda _: None)
    before = FINGERPRINTS["reverse"](pipe)
    (exported / "model.bin").write_bytes(b"other weights")
    assert FINGERPRINTS["reverse"](pipe) != before


def test_an_export_whose_model_file_is_gone_is_gone(tmp_path):
    """Its folder there but model.bin deleted: export stayed 'skipped' and evaluate failed on every run."""
    from xformer_cli.pipeline.checks import gone_output

    pipe = Pipeline(smoke(tmp_path), log=lambda _: None, progress=False)
    record = pipe.record("export")
    record.begin("a")
    exported = record.directory / "student-int8"
    exported.mkdir()
    (exported / "xformer_export.json").write_text("{}")
    record.finish("a", model=pipe.kept(exported))
    assert gone_output(pipe, "export") == exported / "model.bin"
    (exported / "model.bin").write_bytes(b"weights")
    assert gone_output(pipe, "export") is None


def test_a_redo_that_fails_keeps_the_output_of_the_old_inputs(tmp_path, monkeypatch):
    pipe = Pipeline(smoke(tmp_path), log=lambda _: None, progress=False)
    stage = FakeStage(monkeypatch, pipe)
    first = run_stage(pipe, "reverse")
    stage.inputs, stage.fails = "b", XformerError("mono.de:7: invalid UTF-8")
    with pytest.raises(XformerError, match=r"^mono.de:7: invalid UTF-8 \(stage reverse: the output of its previous"):
        run_stage(pipe, "reverse")
    assert pipe.record("reverse").read() == first and (stage.folder / "made").read_text() == "made of a"
    assert not pipe.record("reverse").replaced.exists()
    stage.fails = RuntimeError("a bug")  # any failure but an interrupt
    with pytest.raises(RuntimeError):
        run_stage(pipe, "reverse")
    assert pipe.record("reverse").read() == first
    stage.fails = None
    assert run_stage(pipe, "reverse")["fingerprint"] == "b"
    assert (stage.folder / "made").read_text() == "made of b" and not pipe.record("reverse").replaced.exists()


def test_an_interrupted_redo_resumes_and_the_old_inputs_get_their_output_back(tmp_path, monkeypatch):
    pipe = Pipeline(smoke(tmp_path), log=lambda _: None, progress=False)
    stage = FakeStage(monkeypatch, pipe)
    first = run_stage(pipe, "reverse")
    stage.inputs, stage.fails = "b", KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):  # as a kill would: the new run stays to resume
        run_stage(pipe, "reverse")
    assert pipe.record("reverse").read()["fingerprint"] == "b" and pipe.record("reverse").replaced.exists()
    stage.inputs, stage.fails = "a", AssertionError("a stage up to date is not run")
    assert run_stage(pipe, "reverse") == first  # the inputs went back: their output came back
    assert (stage.folder / "made").read_text() == "made of a" and not pipe.record("reverse").replaced.exists()


def test_a_redo_killed_part_way_resumes_when_asked_again(tmp_path, monkeypatch):
    """`--from STAGE` killed in STAGE and called again: the redo goes on where it stopped (it
    started over from step 0 before); the output it replaces waits aside until it finishes."""
    said: list[str] = []
    pipe = Pipeline(smoke(tmp_path), log=said.append, progress=False)
    stage = FakeStage(monkeypatch, pipe)
    run_stage(pipe, "reverse")
    stage.fails = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):
        run_stage(pipe, "reverse", redo=True)
    (stage.folder / "last.pt").write_text("step 40")  # what the killed redo had trained
    stage.fails = None
    again = run_stage(pipe, "reverse", redo=True)
    assert f"stage reverse: resuming in {stage.folder}" in said and (stage.folder / "last.pt").read_text() == "step 40"
    assert again["done"] and not pipe.record("reverse").replaced.exists()


def test_a_stages_minutes_are_those_of_all_its_calls(tmp_path, monkeypatch):
    """A running stage writes its minutes into its record as it goes (what a kill -9 leaves); the
    call that resumes it goes on from them, so its record (and budget_minutes) counts every call."""
    from xformer_cli.pipeline import record as record_module, status

    monkeypatch.setattr(record_module, "TICK_SECONDS", 0.01)
    said: list[str] = []
    pipe = Pipeline(smoke(tmp_path), log=said.append, progress=False)
    stage = FakeStage(monkeypatch, pipe)
    record = pipe.record("reverse")

    def until_a_tick(_pipe) -> dict:
        for _ in range(1000):
            if "minutes_so_far" in (record.read() or {}):
                raise KeyboardInterrupt  # stopped after the clock wrote
            time.sleep(0.01)
        pytest.fail("no tick written while the stage ran")

    monkeypatch.setitem(runner.RUNS, "reverse", until_a_tick)
    with pytest.raises(KeyboardInterrupt):
        run_stage(pipe, "reverse")
    record.write({**record.read(), "minutes_so_far": 41.5})  # as a call killed 41.5 minutes in leaves it
    assert status._one(pipe, "reverse", lambda _: False).detail.endswith("; 41.5 min so far")
    monkeypatch.setitem(runner.RUNS, "reverse", stage.body)
    done = run_stage(pipe, "reverse")
    assert 41.5 <= done["minutes"] < 41.6 and "minutes_so_far" not in done
    assert said[-1].startswith("stage reverse: done in 41.5") and said[-1].endswith("(41.50 of them in earlier calls)")
    assert run_stage(pipe, "reverse", redo=True)["minutes"] < 0.1  # done afresh: from 0


def test_distillation_counts_its_sources_without_reading_them(tmp_path):
    from xformer_cli.data.sources import PairSource

    write_lines(tmp_path / "c.en", ["one", "", "three", "four"])
    write_lines(tmp_path / "c.de", ["eins", "zwei", "drei", "vier"])
    source = PairSource(CorpusConfig(prefix=str(tmp_path / "c")), "en", "de")
    assert source.line_estimate() == 4 and len(list(source)) == 3  # an estimate: dropped lines count
    assert PairSource(CorpusConfig(prefix=str(tmp_path / "c"), max_pairs=2), "en", "de").line_estimate() == 2
    import gzip

    for lang, text in (("en", "one\ntwo\nthree\n" * 100), ("de", "eins\nzwei\ndrei\n" * 100)):
        (tmp_path / f"z.{lang}.gz").write_bytes(gzip.compress(text.encode()))
    assert PairSource(CorpusConfig(prefix=str(tmp_path / "z")), "en", "de").line_estimate() == 300  # not its bytes' newlines


def test_from_and_only_choose_the_stages(tmp_path):
    assert _chosen(None, None) == (list(STAGES), set())
    assert _chosen("distill", None)[1] == {"distill", "student", "export", "evaluate"}
    assert _chosen(None, "export") == (["export"], set())
    with pytest.raises(XformerError, match="--from: unknown stage 'teach'"):
        _chosen("teach", None)


def test_the_whole_path_sums_each_finished_stages_minutes(tmp_path):
    pipe = Pipeline(smoke(tmp_path), log=lambda _: None)
    for name, minutes in (("reverse", 26.09), ("backtranslate", 6.74), ("teacher", 51.8)):
        pipe.record(name).begin("f")
        pipe.record(name).finish("f", minutes=minutes)
    pipe.record("distill").begin("f")  # begun, not finished: not counted
    assert runner.stage_minutes(pipe) == {"reverse": 26.09, "backtranslate": 6.74, "teacher": 51.8}
    assert (runner.path_line(runner.stage_minutes(pipe))
            == "the whole path: 84.6 minutes of stages (reverse 26.1, backtranslate 6.7, teacher 51.8)")


def smoke(tmp_path: Path, *sets: str):
    return load_pipeline_config(ROOT / "configs" / "pipeline-smoke.yaml", [f"run_dir={tmp_path / 'run'}", *sets])


def test_monolingual_text_a_stage_needs_and_a_beam_past_the_largest_are_found_before_the_first_stage(tmp_path):
    """A mono.target or mono.source left out or empty was found when its stage came, after the
    models before it had trained; an evaluate beam of 300 at the last stage, as --beam-size."""
    from xformer_cli.pipeline.checks import stage_problem

    for key, stage in (("mono.target", "backtranslate"), ("mono.source", "distill")):
        side = key.split(".")[1]
        pipe = Pipeline(smoke(tmp_path, *_own_data(tmp_path), f"{key}="), log=lambda _: None)
        assert stage_problem(pipe, stage) == (f"config key '{key}': the {side}-language text the {stage} stage "
                                              "translates is not given (checked before the first stage runs)")
    assert stage_problem(Pipeline(smoke(tmp_path, *_own_data(tmp_path), "mono.source=", "distill.mono_source=false"),
                                  log=lambda _: None), "distill") is None
    with pytest.raises(XformerError, match=r"^config key 'evaluate.beam_sizes': one or more beam sizes, each 1 to 256$"):
        smoke(tmp_path, "evaluate.beam_sizes=[4, 300]")


def test_the_pipeline_config_names_a_bad_key():
    with pytest.raises(XformerError, match="unknown config key 'teacher.weight'"):
        smoke(Path("/tmp"), "teacher.weight=2")
    with pytest.raises(XformerError, match="config key 'backtranslate.sampling_topk'.*beam_size to 1"):
        smoke(Path("/tmp"), "backtranslate.sampling_topk=10")
    with pytest.raises(XformerError, match="config key 'teacher.set'.*mapping"):
        smoke(Path("/tmp"), "teacher.set=3")
    with pytest.raises(XformerError, match="config key 'export.quantization': one of int8, int8_float32"):
        smoke(Path("/tmp"), "export.quantization=int4")  # found before the student trains, not after
    with pytest.raises(XformerError, match="config key 'threads': must be 0"):
        smoke(Path("/tmp"), "threads=-1")
    for threads, said in (("-1", "must be 0"), ("100000", "it is 100000: at most")):  # found after the student before
        with pytest.raises(XformerError, match=f"config key 'evaluate.threads': {said}"):
            smoke(Path("/tmp"), f"evaluate.threads={threads}")
    with pytest.raises(XformerError, match="config key 'run_dir': .*pipeline-smoke.yaml is a file, not a folder"):
        smoke(Path("/tmp"), f"run_dir={ROOT / 'configs' / 'pipeline-smoke.yaml'}")
    with pytest.raises(XformerError, match="config key 'export.shortlist_per_source'"):
        smoke(Path("/tmp"), "export.shortlist=true", "export.shortlist_per_source=0")
    for seeds in ("[1, 1]", "[1, -2]", "[1, 2.5]", "[true]"):
        with pytest.raises(XformerError, match="config key 'teacher.seeds"):
            smoke(Path("/tmp"), f"teacher.seeds={seeds}")
    with pytest.raises(XformerError, match="config key 'teacher.seeds': several teachers.*name 'teacher'"):
        smoke(Path("/tmp"), "teacher.seeds=[1, 2]", "distill.teachers=[/other/best.pt]")


def test_a_translating_stage_gives_the_engine_its_own_batches_or_the_models(tmp_path, monkeypatch):
    from xformer_cli.decode import factory
    from xformer_cli.pipeline import stages

    asked = []

    class Recording:
        truncated_lines = 0

        def options(self, **opts):
            asked.append(opts)
            return opts

        def translate_lines(self, chunk, opts):
            return [line.upper() for line in chunk]

    monkeypatch.setattr(factory, "load_engine", lambda *args, **kwargs: Recording())
    for sets, batch in (((), (None, None)), (("backtranslate.batch_size=3000", "backtranslate.max_tokens=200000"),
                                             (3000, 200000))):
        asked.clear()
        pipe = Pipeline(smoke(tmp_path, *sets), log=lambda _: None, progress=False)
        job = CorpusJob(["a b", "c"], tmp_path / "in.txt", tmp_path / f"out{len(sets)}.txt", 2, chunk_lines=1)
        assert stages._translate(pipe, [tmp_path / "reverse.pt"], pipe.config.backtranslate, job) == 2
        assert len(asked) == 3 and all((opts["batch_size"], opts["max_tokens"]) == batch for opts in asked)
        assert job.outputs_path.read_text().splitlines() == ["A B", "C"]
    for key in ("distill.batch_size=-1", "backtranslate.max_tokens=-5"):
        with pytest.raises(XformerError, match=f"config key '{key.split('=')[0]}': must be 0"):
            smoke(tmp_path, key)


def test_backtranslating_the_real_targets_gives_the_teacher_new_sources_for_them(tmp_path, monkeypatch):
    """backtranslate.real_targets: the real pairs' targets (as training reads them: the first
    max_pairs, empty pairs left out) back-translated beside the monolingual text; the teacher trains
    on them tagged, at weight 1, until synthetic_until; the stage redoes when the corpus changes."""
    from xformer_cli.decode import factory
    from xformer_cli.pipeline import stages

    class Reversing:
        truncated_lines = 0

        def options(self, **opts):
            return opts

        def translate_lines(self, chunk, opts):
            return [line[::-1] for line in chunk]

    loads = []
    monkeypatch.setattr(factory, "load_engine", lambda *args, **kwargs: loads.append(args) or Reversing())
    monkeypatch.setenv("XFORMER_DATA", str(tmp_path))
    (tmp_path / "multi30k").mkdir()
    write_lines(tmp_path / "multi30k" / "train.en", ["a dog", "", "a cat"] + ["x"] * 700)
    write_lines(tmp_path / "multi30k" / "train.de", ["ein Hund", "leer", "eine Katze"] + ["y"] * 700)
    write_lines(tmp_path / "mono.de", ["Ein Hund läuft.", "Zwei Katzen."])
    sets = (f"mono.target={tmp_path / 'mono.de'}", "teacher.synthetic_until=0.75")
    plain, real = (Pipeline(smoke(tmp_path, *sets, f"backtranslate.real_targets={on}"), log=lambda _: None,
                            progress=False) for on in ("false", "true"))
    finish_upstream(real, "reverse")
    assert stages.fingerprint_backtranslate(real) != stages.fingerprint_backtranslate(plain)
    assert "real_targets" not in stages.stage_settings(plain.config.backtranslate)  # earlier runs stay finished
    monkeypatch.setattr(Pipeline, "model", lambda self, stage: tmp_path / f"{stage}.pt")
    real.record("backtranslate").begin("f")
    record = stages.run_backtranslate(real)
    assert record["lines"] == 2 and record["real_targets"]["lines"] == 600  # max_pairs, the empty pair left out
    assert len(loads) == 1  # one engine for both jobs
    targets, sources = stages.real_target_files(real)
    assert targets.read_text().splitlines()[:3] == ["ein Hund", "eine Katze", "y"]
    assert sources.read_text().splitlines()[:2] == ["dnuH nie", "eztaK enie"]
    corpora = stages.teacher_config(real).data.train
    assert [(c.prefix.split("/")[-1], c.weight, c.tag, c.until) for c in corpora] == [
        ("train", 1.0, None, 1.0), ("synthetic", 1.0, "<bt>", 0.75), ("real-targets", 1.0, "<bt>", 0.75)]
    assert len(stages.teacher_config(plain).data.train) == 2
    from xformer_cli.pipeline.status import _how_far  # what --status says of a stage killed about here

    assert _how_far(real, "backtranslate") == ("after 0 translated lines (the whole chunks of 64), "
                                               "then 576 of the real targets")
    real.record("backtranslate").finish("f", **record)
    assert checks.gone_output(real, "backtranslate") is None
    targets.unlink()
    assert checks.gone_output(real, "backtranslate") == targets
    before = stages.fingerprint_backtranslate(real)
    write_lines(tmp_path / "multi30k" / "train.de", ["ein Hund", "leer", "eine Katze"] + ["z"] * 701)
    assert stages.fingerprint_backtranslate(real) != before  # another corpus: the stage redoes


def test_a_translating_stages_fingerprint_leaves_out_settings_added_later_at_their_default(tmp_path):
    from xformer_cli.pipeline.stages import fingerprint_backtranslate, stage_settings

    config = smoke(tmp_path, "backtranslate.real_targets=false")
    # what runs recorded before batch_size and max_tokens existed hashed: a default stage hashes the same
    assert set(stage_settings(config.backtranslate)) == {"beam_size", "sampling_topk", "temperature", "chunk_lines",
                                                          "engine", "precision"}
    assert set(stage_settings(config.distill)) == set(stage_settings(config.backtranslate)) | {"teachers",
                                                                                                 "mono_source"}
    mono = tmp_path / "mono.de"
    mono.write_text("Ein Hund.\n")
    plain, batched = (Pipeline(smoke(tmp_path, f"mono.target={mono}", "backtranslate.real_targets=false", *sets),
                               log=lambda _: None) for sets in ((), ("backtranslate.batch_size=4000",)))
    plain.record("reverse").begin("f")
    plain.record("reverse").finish("f", minutes=1.0)
    assert stage_settings(batched.config.backtranslate)["batch_size"] == 4000
    assert fingerprint_backtranslate(batched) != fingerprint_backtranslate(plain)


def test_the_files_a_config_names_are_checked_before_the_first_stage(tmp_path, monkeypatch):
    """A misspelt baseline or teacher is found at once, not after hours of the stages before it;
    --status names the stage that needs it."""
    from xformer_cli.pipeline import pipeline_status, run_pipeline

    write_lines(tmp_path / "mono.de", ["Ein Hund läuft."] * 3)
    write_lines(tmp_path / "mono.en", ["A dog runs."] * 3)
    mono = (f"mono.target={tmp_path / 'mono.de'}", f"mono.source={tmp_path / 'mono.en'}")
    for key, value, stage in (("evaluate.baseline", "/no/base.pt", "evaluate"),
                              ("distill.teachers", "[teacher, /no/t.pt]", "distill"),
                              ("reverse.checkpoint", "/no/r.pt", "reverse"), ("mono.source", "/no/m.en", "distill")):
        config = smoke(tmp_path, *mono, f"{key}={value}")
        missing = value.strip("[]").split(", ")[-1]
        said = f"config key '{key}': {missing} not found (checked before the first stage runs)"
        with pytest.raises(XformerError, match=f"^{re.escape(said)}$"):
            run_pipeline(config, log=lambda _: None, progress=False)
        assert not (tmp_path / "run").exists()  # nothing ran, nothing was written
        assert [(s.action, s.detail) for s in pipeline_status(config) if s.stage == stage] == [("fails", said)]
    with pytest.raises(XformerError, match="^config key 'evaluate.baseline'"):  # --only evaluate checks its own
        run_pipeline(smoke(tmp_path, *mono, "evaluate.baseline=/no/b.pt"), only="evaluate", log=lambda _: None)
    absent = tmp_path / "nowhere" / "multi30k" / "mono.de"  # the configs' path, on a machine without the data
    with pytest.raises(XformerError, match="mono.de not found .*; scripts/fetch_multi30k.py makes it"):
        run_pipeline(smoke(tmp_path, f"mono.target={absent}"), log=lambda _: None)
    monkeypatch.setitem(runner.RUNS, "reverse", lambda _: {})  # --only reverse needs no baseline
    run_pipeline(smoke(tmp_path, *mono, "evaluate.baseline=/no/b.pt"), only="reverse", log=lambda _: None)


def test_each_training_stages_own_settings_are_checked_before_the_first_stage(tmp_path):
    """A bad key in teacher.set or student.set failed only when its stage came, after the reverse
    model and the back-translation (hours, in the CPU config); --status said `starts`."""
    from xformer_cli.pipeline import pipeline_status, run_pipeline

    write_lines(tmp_path / "mono.de", ["Ein Hund läuft."] * 3)
    write_lines(tmp_path / "mono.en", ["A dog runs."] * 3)
    mono = (f"mono.target={tmp_path / 'mono.de'}", f"mono.source={tmp_path / 'mono.en'}")
    for given, stage, said in (("teacher.set={model.d_model: abc}", "teacher", "config key 'model.d_model': expected int"),
                               ("student.set={model.n_heads: 3}", "student", "is not divisible by model.n_heads=3"),
                               ("reverse.set={model.pre_norm: maybe}", "reverse", "config key 'model.pre_norm'"),
                               ("teacher.seeds=[1, 2]", None, None)):
        config = smoke(tmp_path, *mono, given)
        failing = [(s.stage, s.detail) for s in pipeline_status(config) if s.action == "fails"]
        if stage is None:  # settings that build: nothing fails
            assert failing == []
            continue
        assert len(failing) == 1 and failing[0][0] == stage and said in failing[0][1]
        with pytest.raises(XformerError, match=rf"^pipeline stage {stage}: .*{re.escape(said)}.*"
                                               r"\(checked before the first stage runs\)$"):
            run_pipeline(config, log=lambda _: None, progress=False)
        assert not (tmp_path / "run").exists()  # nothing ran, nothing was written
    for key, value, message in (("distill.engine", "foo", "must be one of auto, xformer, ctranslate2"),
                                ("backtranslate.beam_size", "1000", "must be 1 to 256"),
                                ("backtranslate.precision", "fp64", "must be one of auto, fp32, .*"),
                                ("distill.engine=xformer --set distill.precision", "int8",
                                 "the xformer engine computes in fp32, bf16, fp16 \\(or auto\\)")):
        *others, key = key.split(" --set ")
        with pytest.raises(XformerError, match=rf"^config key '{key}': {message}$"):
            smoke(tmp_path, *mono, *others, f"{key}={value}")


def test_an_engine_a_translating_stage_cannot_have_is_found_before_the_first_stage(tmp_path):
    """CTranslate2's precision for an ensemble of teachers, or sampling on CTranslate2: refused by the
    engine factory once the teachers had trained, hours in."""
    from xformer_cli.pipeline import pipeline_status, run_pipeline

    for sets, stage, said in (
            (("teacher.seeds=[1, 2]", "distill.precision=float16"), "distill",
             r"the ctranslate2 engine takes one model, not an ensemble \(distill.engine auto, distill.precision "
             r"float16; checked before the first stage runs\)"),
            (("backtranslate.engine=ctranslate2", "backtranslate.beam_size=1", "backtranslate.sampling_topk=10"),
             "backtranslate", "the ctranslate2 engine does not support --sampling-topk, --seed")):
        config = smoke(tmp_path, *_own_data(tmp_path), *sets)
        with pytest.raises(XformerError, match=said):
            run_pipeline(config, log=lambda _: None, progress=False)
        assert not (tmp_path / "run").exists()
        assert [s.action for s in pipeline_status(config) if s.stage == stage] == ["fails"]
    from xformer_cli.pipeline.checks import unusable_engine

    ensemble_in_bf16 = Pipeline(smoke(tmp_path, *_own_data(tmp_path), "teacher.seeds=[1, 2]", "distill.precision=bf16"),
                                log=lambda _: None)
    assert unusable_engine(ensemble_in_bf16, "distill") is None  # the xformer engine runs ensembles


def test_a_teacher_or_baseline_of_the_other_direction_is_found_before_the_first_stage(tmp_path):
    """Only the reverse model's direction was checked: a de->en teacher distilled nonsense, exit 0."""
    import torch

    from xformer_cli.pipeline.checks import stage_problem

    backwards, forwards = tmp_path / "de-en.pt", tmp_path / "en-de.pt"
    torch.save({"config": {"data": {"src_lang": "de", "tgt_lang": "en"}}}, backwards)
    torch.save({"config": {"data": {"src_lang": "en", "tgt_lang": "de"}}}, forwards)
    for key, stage in (("distill.teachers", "distill"), ("evaluate.baseline", "evaluate")):
        value = f"[{backwards}]" if key == "distill.teachers" else str(backwards)
        pipe = Pipeline(smoke(tmp_path, *_own_data(tmp_path), "teacher.seeds=[1]", f"{key}={value}"),
                        log=lambda _: None)
        assert stage_problem(pipe, stage) == (f"config key '{key}': {backwards} translates de->en, not en->de "
                                              "(checked before the first stage runs)")
        value = f"[{forwards}]" if key == "distill.teachers" else str(forwards)
        assert stage_problem(Pipeline(smoke(tmp_path, *_own_data(tmp_path), "teacher.seeds=[1]", f"{key}={value}"),
                                      log=lambda _: None), stage) is None


def test_a_monolingual_file_that_cannot_serve_is_found_before_the_first_stage(tmp_path):
    """A folder, a file of blank lines or bytes that are not UTF-8 as mono.target failed after the
    reverse model had trained (a folder: "file not found"; an empty file: 0 back-translations, exit 0)."""
    from xformer_cli.pipeline import pipeline_status, run_pipeline

    (tmp_path / "folder").mkdir()
    write_lines(tmp_path / "blank.de", ["", "  "])
    (tmp_path / "binary.de").write_bytes(b"Ein Hund.\n\xff\xfe\x00\n")
    for given, said in (("folder", "is a directory, not a text file"),
                        ("blank.de", r"has no line to translate \(2 empty\)"),
                        ("binary.de", r"binary.de:2: invalid UTF-8 .*mono.skip_invalid_utf8: true")):
        config = smoke(tmp_path, f"mono.target={tmp_path / given}")
        with pytest.raises(XformerError, match=said):
            run_pipeline(config, log=lambda _: None, progress=False)
        assert not (tmp_path / "run").exists()  # nothing ran, nothing was written
    statuses = pipeline_status(smoke(tmp_path, f"mono.target={tmp_path / 'blank.de'}"))
    assert [s.action for s in statuses if s.stage == "backtranslate"] == ["fails"]
    statuses = pipeline_status(smoke(tmp_path, f"mono.target={tmp_path / 'binary.de'}"))  # it stopped --status
    failing = next(s for s in statuses if s.stage == "backtranslate")
    assert failing.action == "fails" and failing.detail.startswith(f"{tmp_path / 'binary.de'}:2: invalid UTF-8")
    skipped = smoke(tmp_path, f"mono.target={tmp_path / 'binary.de'}", "mono.skip_invalid_utf8=true")
    assert [s.action for s in pipeline_status(skipped) if s.stage == "backtranslate"] != ["fails"]


def test_a_monolingual_file_is_read_before_the_run_only_as_far_as_and_when_a_stage_will_read_it(tmp_path):
    """The check reads mono.max_lines usable lines, as the stage does (a bad line past them is no
    reason to refuse the run), and skips a file the stage's finished record says it read as it is."""
    from xformer_cli.file_stamps import file_stamp, stamps_by_time
    from xformer_cli.pipeline.checks import unusable_named_file

    mono = tmp_path / "mono.de"
    mono.write_bytes(b"Ein Hund.\nEine Katze.\n\xff\xfe\n")
    pipe = Pipeline(smoke(tmp_path, f"mono.target={mono}", "mono.max_lines=2"), log=lambda _: None)
    assert unusable_named_file(pipe, "backtranslate") is None
    pipe = Pipeline(smoke(tmp_path, f"mono.target={mono}", "mono.max_lines=3"), log=lambda _: None)
    with pytest.raises(XformerError, match="mono.de:3: invalid UTF-8"):
        unusable_named_file(pipe, "backtranslate")
    pipe.record("backtranslate").directory.mkdir(parents=True)
    pipe.record("backtranslate").finish("f", mono_read=file_stamp(mono))  # the stage read it whole
    assert unusable_named_file(pipe, "backtranslate") is None  # not read again
    with stamps_by_time():  # an earlier version's record of the file as it is
        pipe.record("backtranslate").finish("f", mono_read=file_stamp(mono))
    assert unusable_named_file(pipe, "backtranslate") is None
    mono.write_bytes(b"Ein Hund.\nEine Katze!\n\xff\xfe\n")  # rewritten since, to the same size
    with pytest.raises(XformerError, match="mono.de:3: invalid UTF-8"):
        unusable_named_file(pipe, "backtranslate")


def test_a_stage_asked_for_before_the_stages_it_needs_is_one_line(tmp_path):
    pipe = Pipeline(smoke(tmp_path), log=lambda _: None)
    with pytest.raises(XformerError, match="pipeline stage backtranslate has not finished.*--only backtranslate"):
        pipe.upstream("teacher")


def test_each_model_stage_gets_its_data_and_run_dir(tmp_path):
    from xformer_cli.pipeline import stages

    pipe = Pipeline(smoke(tmp_path), log=lambda _: None)
    reverse = stages.reverse_config(pipe)
    assert (reverse.data.src_lang, reverse.data.tgt_lang) == ("de", "en")
    assert reverse.run_dir == str(tmp_path / "run" / "reverse")
    teacher = stages.teacher_config(pipe)
    real, synthetic, real_targets = teacher.data.train
    assert real.max_pairs == 600 and real.tag is None  # the model_set reached the real corpus
    assert synthetic.prefix.endswith("backtranslate/synthetic") and synthetic.tag == "<bt>"
    assert real_targets.prefix.endswith("backtranslate/real-targets") and real_targets.tag == "<bt>"
    student = stages.student_config(pipe)
    assert [c.prefix.split("/")[-1] for c in student.data.train] == ["distilled"]
    assert (student.model.encoder_layers, student.model.decoder_layers) == (2, 1)


def finish_upstream(pipe: Pipeline, *stages_done: str) -> None:
    for stage in stages_done:
        pipe.record(stage).begin(f"fp-{stage}")
        pipe.record(stage).finish(f"fp-{stage}")


def test_teacher_seeds_train_one_teacher_each_on_the_first_ones_tokenizer(tmp_path):
    from xformer_cli.pipeline import models, stages

    single = Pipeline(smoke(tmp_path, "teacher.seeds=[]"), log=lambda _: None)
    pair = Pipeline(smoke(tmp_path, "teacher.seeds=[3, 5]"), log=lambda _: None)
    finish_upstream(single, "reverse", "backtranslate")
    (one,) = stages.teacher_configs(single)
    first, second = stages.teacher_configs(pair)
    folder = tmp_path / "run" / "teacher"
    assert (first.run_dir, first.train.seed, first.tokenizer.model) == (str(folder), 3, None)
    assert (second.run_dir, second.train.seed) == (str(folder / "seed-5"), 5)
    assert second.tokenizer.model == str(folder / "tokenizer" / "joint.model")  # one vocabulary: an ensemble
    assert first.data.train == second.data.train == one.data.train  # the same real and tagged synthetic pairs
    # a single teacher's fingerprint is the one made before teacher.seeds: a finished run stays finished
    before = fingerprint("teacher", models.config_stamp(one, single.run_dir), single.upstream("teacher"),
                         home=single.run_dir)
    assert stages.fingerprint_teacher(single) == before
    same_seed = Pipeline(smoke(tmp_path, f"teacher.seeds=[{one.train.seed}]"), log=lambda _: None)
    assert stages.fingerprint_teacher(same_seed) == before
    assert stages.fingerprint_teacher(pair) != stages.fingerprint_teacher(single)
    shorter = Pipeline(smoke(tmp_path, "teacher.seeds=[3]"), log=lambda _: None)
    assert stages.fingerprint_teacher(shorter) != stages.fingerprint_teacher(pair)


def test_the_teacher_stage_trains_each_seed_and_distill_takes_them_all(tmp_path, monkeypatch):
    from xformer_cli.pipeline import stages

    pipe = Pipeline(smoke(tmp_path, "teacher.seeds=[3, 5]"), log=lambda _: None)
    finish_upstream(pipe, "reverse", "backtranslate")
    trained = []

    def fake_train(_, config):
        trained.append((config.run_dir, config.train.seed))
        return {"model": f"{config.run_dir}/best.pt", "steps": 10 * config.train.seed, "best_valid_bleu": 1.0}

    monkeypatch.setattr(stages, "_train", fake_train)
    done = stages.run_teacher(pipe)
    folder = tmp_path / "run" / "teacher"
    assert trained == [(str(folder), 3), (str(folder / "seed-5"), 5)]
    assert (done["model"], done["steps"]) == (f"{folder}/best.pt", 30)  # the first teacher is the stage's model
    assert done["models"] == [f"{folder}/best.pt", f"{folder}/seed-5/best.pt"]
    pipe.record("teacher").begin("fp-teacher")
    pipe.record("teacher").finish("fp-teacher", **done)
    assert stages._teachers(pipe) == [folder / "best.pt", folder / "seed-5" / "best.pt"]
    other = Pipeline(smoke(tmp_path, "teacher.seeds=[3, 5]", f"distill.teachers=[{tmp_path / 'x.pt'}, teacher]"),
                     log=lambda _: None)
    assert stages._teachers(other) == [tmp_path / "x.pt", folder / "best.pt", folder / "seed-5" / "best.pt"]
    pipe.record("teacher").finish("fp-teacher", model=str(folder / "best.pt"))  # a record from before seeds
    assert stages._teachers(pipe) == [folder / "best.pt"]


@pytest.mark.parametrize("given, shared", [
    ([], {"tokenizer.model": "{run}/tokenizer/joint.model"}),  # the first teacher's, trained in its run_dir
    (["tokenizer.joint=false"], {"tokenizer.model": "{run}/tokenizer/src.model",
                                 "tokenizer.tgt_model": "{run}/tokenizer/tgt.model"}),
    (["tokenizer.model=/given/joint.model"], {}),  # every teacher reads the given one already
    (["train.init_from=/given/model.pt"], {}),  # ... or the pretrained model's
])
def test_the_other_teachers_read_the_first_ones_tokenizer(tmp_path, given, shared):
    from xformer_cli.pipeline import stages

    sets = [f"teacher.set.{key}" for key in given]
    pipe = Pipeline(smoke(tmp_path, "teacher.seeds=[1, 2]", *sets), log=lambda _: None)
    first = stages.teacher_configs(pipe)[0]
    run = str(tmp_path / "run" / "teacher")
    assert stages._tokenizer_of(first) == {key: value.format(run=run) for key, value in shared.items()}


def test_a_teacher_finished_before_a_kill_is_not_trained_again(tmp_path, monkeypatch):
    from xformer_cli.pipeline import stages

    pipe = Pipeline(smoke(tmp_path, "teacher.seeds=[1, 2]"), log=lambda _: None)
    finish_upstream(pipe, "reverse", "backtranslate")
    trained = []

    def killed_in_the_second(_, config):
        trained.append(config.train.seed)
        if config.train.seed == 2 and trained.count(2) == 1:
            raise KeyboardInterrupt
        Path(config.run_dir).mkdir(parents=True, exist_ok=True)
        Path(config.run_dir, "best.pt").write_bytes(b"weights")
        # The first names another folder, as one written before run folders could move and then copied would.
        return {"model": f"/elsewhere/{config.train.seed}/best.pt" if config.train.seed == 1 else
                pipe.kept(Path(config.run_dir) / "best.pt"), "steps": 1, "best_valid_bleu": 1.0}

    monkeypatch.setattr(stages, "_train", killed_in_the_second)
    with pytest.raises(KeyboardInterrupt):
        stages.run_teacher(pipe)
    done = stages.run_teacher(pipe)  # the rerun: the second resumes, the first is kept as it finished
    assert trained == [1, 2, 2]
    assert done["models"] == ["<run_dir>/teacher/best.pt", "<run_dir>/teacher/seed-2/best.pt"]
    assert done["teachers"][0]["steps"] == 1


def test_an_option_added_later_stays_out_of_a_stage_fingerprint_until_it_is_set(tmp_path):
    from xformer_cli.pipeline import models, stages

    pipe = Pipeline(smoke(tmp_path), log=lambda _: None)
    teacher = stages.teacher_config(pipe)
    assert teacher.data.quote_augmentation == 0
    off = models.config_stamp(teacher, pipe.run_dir)
    assert "quote_augmentation" not in off["config"]["data"]  # a teacher finished before it stays finished
    teacher.data.quote_augmentation = 2.0
    on = models.config_stamp(teacher, pipe.run_dir)
    assert on["config"]["data"]["quote_augmentation"] == 2.0 and on != off
    student = models.config_stamp(stages.student_config(pipe), pipe.run_dir)
    assert student["config"]["data"]["quote_augmentation"] == 4.0  # the smoke student sets it


def test_the_synthetic_corpus_ends_at_teacher_synthetic_until_and_stays_out_of_the_fingerprint_at_1(tmp_path):
    from xformer_cli.pipeline import models, stages

    pipe = Pipeline(smoke(tmp_path, "teacher.synthetic_until=1"), log=lambda _: None)
    teacher = stages.teacher_config(pipe)
    assert [c.until for c in teacher.data.train] == [1.0, 1.0, 1.0]
    off = models.config_stamp(teacher, pipe.run_dir)
    assert not any("until" in c for c in off["config"]["data"]["train"])  # a teacher finished before it stays finished
    assert "until" not in off["config"]["data"]["valid"]
    pipe = Pipeline(smoke(tmp_path, "teacher.synthetic_until=0.75"), log=lambda _: None)
    teacher = stages.teacher_config(pipe)
    assert [c.until for c in teacher.data.train] == [1.0, 0.75, 0.75]  # the real pairs train to the end
    on = models.config_stamp(teacher, pipe.run_dir)
    assert [c.get("until") for c in on["config"]["data"]["train"]] == [None, 0.75, 0.75]
    with pytest.raises(XformerError, match="config key 'teacher.synthetic_until': must be above 0 and at most 1"):
        smoke(tmp_path, "teacher.synthetic_until=0")


def test_a_corpus_tag_is_a_control_piece_no_text_can_produce(tmp_path):
    sentences = [f"a man rides bike number {i} in the park" for i in range(200)]
    tok = Tokenizer.train(sentences, [], joint=True, vocab_size=100, control_symbols=["<bt>"])
    tag = tok.tag_id("<bt>")
    assert tok.src.id_to_piece(tag) == "<bt>"
    assert tag not in tok.src.encode("<bt> a man rides <bt>")
    assert tok.decode_tgt([[tag] + tok.src.encode("a man")]) == ["a man"]


def test_a_corpus_tag_must_look_like_one_and_only_on_training_corpora():
    with pytest.raises(XformerError, match=r"data.train.tag'.*<xxx>"):
        load_config(ROOT / "configs" / "multi30k.yaml", ["data.train.tag=bt"])
    with pytest.raises(XformerError, match=r"data.valid.tag'.*only data.train"):
        load_config(ROOT / "configs" / "multi30k.yaml", ["data.valid.tag=<bt>"])


def test_the_tagged_corpus_leads_its_sources_with_the_tag_in_the_cache(tmp_path):
    from xformer_cli.data.prepare import prepare_data

    real = [f"a man rides bike number {i}" for i in range(60)]
    write_lines(tmp_path / "real.en", real)
    write_lines(tmp_path / "real.de", [f"ein Mann fährt Rad {i}" for i in range(60)])
    write_lines(tmp_path / "bt.en", [f"the dog runs {i}" for i in range(40)])
    write_lines(tmp_path / "bt.de", [f"der Hund läuft {i}" for i in range(40)])
    train = json.dumps([{"prefix": str(tmp_path / "real")}, {"prefix": str(tmp_path / "bt"), "tag": "<bt>"}])
    cfg = load_config(None, [f"run_dir={tmp_path / 'run'}", f"data.train={train}", "data.valid=null", "data.test=null",
                             "tokenizer.vocab_size=120"])
    prepared = prepare_data(cfg, lambda _: None)
    cache, tokenizer = prepared.train, prepared.tokenizer
    tag = tokenizer.tag_id("<bt>")
    firsts = [int(cache.src_ids[cache.src_offsets[i]]) for i in range(len(cache))]
    assert firsts.count(tag) == 40 and all(f == tag for f in firsts[60:])
    assert CorpusConfig().tag is None


def test_overrides_nested_or_dotted_are_the_same():
    from xformer_cli.pipeline import models
    from xformer_cli.pipeline.models import as_overrides

    assert as_overrides({"model": {"d_model": 64}, "train.max_steps": 5}) == ["model.d_model=64", "train.max_steps=5"]
    rule = {"train.dropout_by_planned_epochs": {16.8: 0.2}}
    assert as_overrides(rule) == ['train.dropout_by_planned_epochs={16.8: 0.2}']
    # a rule by steps kept its number keys ('expected int, got '3500'' in every stage), and a mapping
    # under a dotted key replaces it, as train's --set does (it was merged into the corpus it replaced)
    assert as_overrides({"train.dropout_by_planned_steps": {3500: 0.2}, "data.train": {"dataset": "corpus"}}) == [
        "train.dropout_by_planned_steps={3500: 0.2}", "data.train={dataset: corpus}"]
    base = models.base_config(load_pipeline_config(ROOT / "configs" / "pipeline-smoke.yaml", [
        "model_set={train.dropout_by_planned_epochs: {}, train.dropout_by_planned_steps: {3500: 0.2}}"]))
    assert base.train.dropout_by_planned_steps == {3500: 0.2}


@pytest.mark.parametrize("name", ["multi30k-pipeline", "multi30k-pipeline-gpu", "pipeline-smoke"])
def test_the_shipped_pipeline_configs_load_and_derive_every_model(name, tmp_path):
    from xformer_cli.pipeline import stages

    pipe = Pipeline(load_pipeline_config(ROOT / "configs" / f"{name}.yaml", [f"run_dir={tmp_path}"]))
    assert pipe.langs == ("en", "de")
    assert stages.reverse_config(pipe).data.src_lang == "de"
    assert stages.teacher_config(pipe).data.train[-1].tag == "<bt>"
    student = stages.student_config(pipe).model
    assert student.encoder_layers > student.decoder_layers


class EchoEngine:
    """An engine that translates by copying: "2 Hunde" scores BLEU 100 against itself."""

    def __init__(self, name: str = "fake"):
        self.name = name

    def options(self, beam_size):
        return beam_size

    def search(self, lines, opts):
        from types import SimpleNamespace

        return [[SimpleNamespace(tokens=line.split())] for line in lines]

    def detokenize(self, hyp):
        return " ".join(hyp.tokens)


def test_the_translating_stages_use_the_threads_training_uses(tmp_path, monkeypatch):
    """The pipeline keeps OpenMP's default waits (train's), so its engines take every core
    as training does, not decode.factory's one fewer for spinning threads; a number in the
    config, or evaluate's own, wins."""
    import torch

    from xformer_cli.pipeline.stages import stage_threads

    monkeypatch.setattr(torch, "get_num_threads", lambda: 6)
    assert stage_threads(Pipeline(smoke(tmp_path), log=lambda _: None)) == 6
    assert stage_threads(Pipeline(smoke(tmp_path, "threads=3"), log=lambda _: None)) == 3
    assert stage_threads(Pipeline(smoke(tmp_path, "threads=3"), log=lambda _: None), asked=5) == 5


@pytest.mark.slow
def test_the_pipeline_command_leaves_openmp_its_default_waits(tmp_path):
    """Sleeping waits (what translate sets) made every training step of the pipeline slower:
    the pipeline command, a training job, leaves the policy to OpenMP as train does."""
    import subprocess
    import sys

    code = ("import os; os.environ.pop('OMP_WAIT_POLICY', None); from typer.testing import CliRunner; "
            "from xformer_cli.cli import app; "
            f"r = CliRunner().invoke(app, ['pipeline', '-c', {str(tmp_path / 'missing.yaml')!r}]); "
            "print(r.exit_code, os.environ.get('OMP_WAIT_POLICY', 'unset'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert done.stdout.split() == ["1", "unset"]


def test_evaluate_times_the_fastest_of_its_passes_taken_in_turns(tmp_path, monkeypatch):
    """A burst of another process slows one pass, not the engine: a row's speed is its fastest
    pass, and the output (hence BLEU) is the same whichever pass gave it. The passes go in
    turns over the models, so a slow spell (here the first two passes) does not fall on one
    model's every pass."""
    from types import SimpleNamespace

    from xformer_cli.data.sources import ParallelCorpus
    from xformer_cli.decode import factory
    from xformer_cli.pipeline import evaluation

    clock = SimpleNamespace(now=0.0, passes=iter([4.0, 4.0, 1.0, 2.0]), order=[])  # seconds each timed pass takes

    class Timed:
        def __init__(self, name):
            self.name = name

        def options(self, beam_size):
            return beam_size

        def search(self, lines, opts):
            if len(lines) == 10:  # a timed pass over the whole split (the warm-up reads 8 lines)
                clock.now += next(clock.passes)
                clock.order.append(self.name)
            return [[SimpleNamespace(tokens=line.split())] for line in lines]

        def detokenize(self, hyp):
            return " ".join(hyp.tokens)

    monkeypatch.setattr(evaluation.time, "perf_counter", lambda: clock.now)
    monkeypatch.setattr(factory, "load_engine", lambda paths, threads, needs, log: Timed(paths[0].name))
    monkeypatch.setattr(evaluation, "model_size_mb", lambda path: 1.0)
    lines = ["a dog runs on the grass", "two men play", "a cat", "the 3 children sing", "one"] * 2
    models = [("teacher", tmp_path / "teacher"), ("student", tmp_path / "student")]
    rows = evaluation.score_models(models, {"test": ParallelCorpus(lines, lines)}, [1], 2, ("de", "de"),
                                   lambda _: None, timed_passes=2)
    assert clock.order == ["teacher", "student", "teacher", "student"]
    assert [r.sentences_per_s for r in rows] == [10.0, 5.0]  # 10 sentences in 4 then 1 s; in 4 then 2 s
    assert [(r.bleu, r.chrf, r.numbers) for r in rows] == [(100.0, 100.0, 100.0)] * 2
    clock.passes = iter([4.0, 4.0])
    once = evaluation.score_models(models, {"test": ParallelCorpus(lines, lines)}, [1], 2, ("de", "de"),
                                   lambda _: None, timed_passes=1)
    assert [r.sentences_per_s for r in once] == [2.5, 2.5]


def test_evaluate_scores_a_beam_on_the_engine_translate_would_pick(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from xformer_cli.data.sources import ParallelCorpus
    from xformer_cli.decode import factory
    from xformer_cli.pipeline.evaluation import score_models

    asked = []
    Echo = EchoEngine

    def fake_load(paths, threads, needs, log):
        asked.append(tuple(needs))
        if needs:
            log(f"precision: auto -> engine {len(asked)} (why), 2 threads")
            return Echo()
        log("precision: auto -> ctranslate2 default on cpu (the export's own weights), 2 threads")
        return SimpleNamespace(**{name: getattr(Echo(), name) for name in ("options", "search", "detokenize")},
                               name="ctranslate2", precision="int8", shortlist=True)  # an int8 export's
                                                                                    # compute type, its shortlist

    monkeypatch.setattr(factory, "load_engine", fake_load)
    (tmp_path / "model.bin").write_bytes(b"\0" * 2**20)
    lines = ["2 Hunde laufen", "ein Mann mit 3 Katzen"]
    rows = score_models([("student", tmp_path)], {"test": ParallelCorpus(lines, lines)}, [1, 4, 5], 2, ("de", "de"),
                       lambda _: None)
    assert asked == [(), ("beam_search",)]  # one engine per kind of search, loaded once
    assert [(r.beam_size, r.engine) for r in rows] == [(1, "ctranslate2 int8 on cpu, shortlist"), (4, "engine 2"),
                                                      (5, "engine 2")]
    assert rows[0].bleu == 100.0 and rows[0].numbers == 100.0 and rows[0].size_mb == 1.0


def test_evaluate_adds_the_distillation_teacher_when_it_is_another_model(tmp_path):
    from xformer_cli.pipeline import stages

    def finished(*sets):
        pipe = Pipeline(smoke(tmp_path, "teacher.seeds=[]", *sets), log=lambda _: None)
        for stage, model in (("teacher", "t.pt"), ("student", "s.pt"), ("export", "s-int8")):
            record = pipe.record(stage)
            record.begin(f"fp-{stage}")
            record.finish(f"fp-{stage}", model=str(tmp_path / model))
        return [(name, [p.name for p in paths]) for name, paths in stages._evaluated(pipe)]

    plain = [("teacher", ["t.pt"]), ("student", ["s.pt"]), ("student-int8", ["s-int8"])]
    assert finished() == plain  # the pipeline's own teacher distilled: no second row of it
    assert finished(f"evaluate.baseline={tmp_path / 'main.pt'}", f"distill.teachers=[{tmp_path / 'main.pt'}]") == \
        [("baseline", ["main.pt"])] + plain  # the baseline distilled: one row of it
    assert finished(f"distill.teachers=[teacher, {tmp_path / 'other.pt'}]") == \
        plain[:1] + [("distillation teacher", ["t.pt", "other.pt"])] + plain[1:]


def test_evaluate_scores_each_seeds_teacher_and_their_ensemble(tmp_path):
    from xformer_cli.pipeline import stages

    pipe = Pipeline(smoke(tmp_path, "teacher.seeds=[1, 7]"), log=lambda _: None)
    models = {"teacher": ["t.pt", "seed-7.pt"], "student": ["s.pt"], "export": ["s-int8"]}
    for stage, names in models.items():
        record = pipe.record(stage)
        record.begin(f"fp-{stage}")
        paths = [str(tmp_path / name) for name in names]
        record.finish(f"fp-{stage}", model=paths[0], **({"models": paths} if stage == "teacher" else {}))
    assert [(name, [p.name for p in paths]) for name, paths in stages._evaluated(pipe)] == [
        ("teacher", ["t.pt"]), ("teacher (seed 7)", ["seed-7.pt"]),
        ("distillation teacher", ["t.pt", "seed-7.pt"]), ("student", ["s.pt"]), ("student-int8", ["s-int8"])]


def test_evaluate_scores_an_ensemble_as_one_row(tmp_path, monkeypatch):
    from xformer_cli.data.sources import ParallelCorpus
    from xformer_cli.decode import factory
    from xformer_cli.pipeline import evaluation

    loaded = []

    def fake_load(paths, threads, needs, log):
        loaded.append([p.name for p in paths])
        log("precision: auto -> xformer fp32 on cpu (why), 2 threads")
        return EchoEngine("xformer")

    monkeypatch.setattr(factory, "load_engine", fake_load)
    monkeypatch.setattr(evaluation, "model_size_mb", lambda path: {"a.pt": 1.5, "b.pt": 2.0}[path.name])
    lines = ["zwei Hunde", "ein Mann"]
    rows = evaluation.score_models([("teachers", [tmp_path / "a.pt", tmp_path / "b.pt"])],
                                   {"test": ParallelCorpus(lines, lines)}, [4], 2, ("de", "de"), lambda _: None)
    assert loaded == [["a.pt", "b.pt"]]  # one engine over both checkpoints
    (row,) = rows
    assert (row.engine, row.size_mb) == ("xformer fp32 on cpu, ensemble of 2", 3.5)
    assert row.path == f"{tmp_path / 'a.pt'}, {tmp_path / 'b.pt'}"


def test_a_fingerprint_hashes_the_run_folders_own_paths_as_run_dir(tmp_path):
    parts = {"data": "/corpus/train", "model": "{run}/teacher/best.pt", "run_dir": "{run}"}

    def at(run: Path) -> dict:
        return {key: value.format(run=run) for key, value in parts.items()}

    a, b = tmp_path / "run", tmp_path / "elsewhere" / "run"
    assert fingerprint(at(a), home=a) == fingerprint(at(b), home=b)
    assert fingerprint(at(a)) != fingerprint(at(b))  # without a home: the paths as they are
    near = fingerprint({**at(a), "near": f"{a}2/x"}, home=a)  # a name that only begins as the folder's is not in it
    assert near != fingerprint({**at(b), "near": f"{b}2/x"}, home=b)
    assert fingerprint({**at(a), "data": "/corpus/valid"}, home=a) != fingerprint(at(a), home=a)
    assert at_home(a / "teacher" / "best.pt", a) == "<run_dir>/teacher/best.pt"
    assert from_home("<run_dir>/teacher/best.pt", b) == b / "teacher" / "best.pt"
    assert at_home("/given/reverse.pt", a) == "/given/reverse.pt" == str(from_home("/given/reverse.pt", b))


def test_a_record_from_before_run_folders_could_move_stays_finished_and_then_moves(tmp_path, monkeypatch):
    """Records whose fingerprints hashed the folder's paths as they were, and which name their
    models by absolute path: at the same place with the same inputs each stage is up to date,
    its record upgraded; then the folder moves and the stages stay finished, reading the new place."""
    from xformer_cli.pipeline import stages

    pipe = Pipeline(smoke(tmp_path), log=lambda _: None)
    finish_upstream(pipe, "reverse", "backtranslate", "teacher", "distill")
    run = tmp_path / "run"
    for name, model in (("student", run / "student" / "best.pt"), ("export", run / "export" / "student-int8")):
        stamp = earlier_forms.old_fingerprint(pipe, name, "absolute")  # as the code before made them
        pipe.record(name).begin(stamp)
        pipe.record(name).finish(stamp, model=str(model))
        if name == "export":  # what the record names is there
            model.mkdir()
            (model / "model.bin").write_bytes(b"weights")
            (model / "xformer_export.json").write_text("{}")
        else:
            model.write_bytes(b"weights")
    for name in ("student", "export"):
        monkeypatch.setitem(runner.RUNS, name, lambda _: pytest.fail("a finished stage ran again"))
    for name in ("student", "export"):
        upgraded = run_stage(pipe, name)
        assert upgraded["fingerprint"] == stages.FINGERPRINTS[name](pipe) != upgraded["old_fingerprints"]["absolute"]
    assert json.loads((run / "student" / "stage.json").read_text())["model"] == "<run_dir>/student/best.pt"
    moved = tmp_path / "elsewhere"
    run.rename(moved)
    there = Pipeline(load_pipeline_config(ROOT / "configs" / "pipeline-smoke.yaml", [f"run_dir={moved}"]),
                     log=lambda _: None)
    for name in ("student", "export"):
        run_stage(there, name)
    assert there.model("export") == moved / "export" / "student-int8"
    other = Pipeline(smoke(tmp_path, "student.set.train.seed=7"), log=lambda _: None)  # other inputs: not upgraded
    finish_upstream(other, "reverse", "backtranslate", "teacher", "distill")
    stamp = earlier_forms.old_fingerprint(pipe, "student", "absolute")
    other.record("student").begin(stamp)
    other.record("student").finish(stamp, model=str(run / "student" / "best.pt"))
    assert not earlier_forms.upgrade(other, "student", stages.FINGERPRINTS["student"](other))


def _own_data(tmp_path: Path) -> tuple[str, ...]:
    """Overrides that read the pipeline's corpus and monolingual text from ``tmp_path``."""
    write_lines(tmp_path / "t.en", ["A dog runs."] * 5)
    write_lines(tmp_path / "t.de", ["Ein Hund läuft."] * 5)
    write_lines(tmp_path / "mono.de", ["Ein Hund läuft."] * 3)
    write_lines(tmp_path / "mono.en", ["A dog runs."] * 3)
    return (f"model_set.data.train.prefix={tmp_path / 't'}", f"mono.target={tmp_path / 'mono.de'}",
            f"mono.source={tmp_path / 'mono.en'}")


def _actions(config, count: int) -> list[tuple[str, str]]:
    from xformer_cli.pipeline import pipeline_status

    return [(s.stage, s.action) for s in pipeline_status(config)][:count]


def _never_run(monkeypatch, *names: str) -> None:
    for name in names:
        monkeypatch.setitem(runner.RUNS, name, lambda _: pytest.fail("a finished stage ran again"))


def test_finished_stages_stay_finished_when_their_files_get_new_times_and_redo_when_the_text_changes(
        tmp_path, monkeypatch):
    """A data folder provisioned again (new modification times, the same bytes at the same paths)."""
    from xformer_cli.pipeline import stages

    config = smoke(tmp_path, *_own_data(tmp_path))
    pipe = Pipeline(config, log=lambda _: None)
    for name in ("reverse", "backtranslate"):
        stamp = stages.FINGERPRINTS[name](pipe)
        pipe.record(name).begin(stamp)
        pipe.record(name).finish(stamp, lines=3)
    later = time.time() + 3600
    for name in ("t.en", "t.de", "mono.de"):
        os.utime(tmp_path / name, (later, later))
    assert _actions(config, 3) == [("reverse", "skipped"), ("backtranslate", "skipped"), ("teacher", "starts")]
    _never_run(monkeypatch, "reverse", "backtranslate")
    said: list[str] = []
    for name in ("reverse", "backtranslate"):
        run_stage(Pipeline(config, log=said.append), name)
    assert len(said) == 2 and all(line.endswith("skipped") for line in said)
    write_lines(tmp_path / "mono.de", ["Ein Hund läuft!"] * 3)  # the same size: the bytes tell
    assert _actions(config, 2) == [("reverse", "skipped"), ("backtranslate", "redone")]
    write_lines(tmp_path / "t.de", ["Ein Hund rennt."] * 5)
    assert _actions(config, 1) == [("reverse", "redone")]


def test_new_test_references_score_again_and_a_new_valid_set_trains_again(tmp_path):
    """evaluate's fingerprint stamps the valid and test files (it hashed their paths alone: edited
    references kept the old scores); the training stages' do not move for the test set, and do for
    the valid set, which picks each model's best.pt and length penalty (they hashed its path alone)."""
    from xformer_cli.pipeline import stages

    for split in ("v", "tt"):
        write_lines(tmp_path / f"{split}.en", ["A cat sits."] * 2)
        write_lines(tmp_path / f"{split}.de", ["Eine Katze sitzt."] * 2)
    config = smoke(tmp_path, *_own_data(tmp_path), f"model_set.data.valid.prefix={tmp_path / 'v'}",
                   f"model_set.data.test.prefix={tmp_path / 'tt'}")
    pipe = Pipeline(config, log=lambda _: None)
    for name in STAGES:
        stamp = stages.FINGERPRINTS[name](pipe)
        pipe.record(name).begin(stamp)
        pipe.record(name).finish(stamp)
    before = {name: stages.FINGERPRINTS[name](pipe) for name in STAGES}
    write_lines(tmp_path / "tt.de", ["Eine Katze liegt."] * 2)
    after = {name: stages.FINGERPRINTS[name](pipe) for name in STAGES}
    assert [name for name in STAGES if before[name] != after[name]] == ["evaluate"]
    assert _actions(config, len(STAGES))[-1] == ("evaluate", "redone")
    write_lines(tmp_path / "v.de", ["Eine Katze liegt."] * 2)
    assert all(stages.FINGERPRINTS[name](pipe) != after[name] for name in ("reverse", "teacher", "student"))
    assert _actions(config, 1) == [("reverse", "redone")]


def test_data_files_and_saved_datasets_a_stage_reads_are_in_its_fingerprint(tmp_path):
    """A training corpus given as data files or as a dataset saved to disk: an edit of its bytes
    redoes the stages that read it (their fingerprints held its name and split alone)."""
    import datasets

    from xformer_cli.pipeline import stages

    rows = [{"translation": {"en": "A dog runs.", "de": "Ein Hund läuft."}}] * 5
    write_lines(tmp_path / "t.jsonl", [json.dumps(row) for row in rows])
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    for corpus in (f"data_files={tmp_path / 't.jsonl'}", f"dataset={tmp_path / 'saved'}"):
        config = smoke(tmp_path, *_own_data(tmp_path)[1:], "model_set.data.train.prefix=null",
                       f"model_set.data.train.{corpus}")
        pipe = Pipeline(config, log=lambda _: None)
        before = stages.FINGERPRINTS["reverse"](pipe)
        assert stages.FINGERPRINTS["reverse"](pipe) == before
        if "jsonl" in corpus:
            write_lines(tmp_path / "t.jsonl", [json.dumps(row) for row in rows[:4]])
        else:
            datasets.Dataset.from_list(rows[:4]).save_to_disk(str(tmp_path / "saved2"))
            shutil.rmtree(tmp_path / "saved")
            (tmp_path / "saved2").rename(tmp_path / "saved")
        assert stages.FINGERPRINTS["reverse"](pipe) != before, corpus


def test_records_of_a_version_that_stamped_the_training_text_alone_stay_finished(tmp_path, monkeypatch):
    """Records made before the valid set was stamped: with the same inputs, every stage is up to
    date (upgraded, not run again); a valid set edited since redoes the first training stage."""
    from xformer_cli.pipeline import stages

    write_lines(tmp_path / "v.en", ["A cat sits."] * 2)
    write_lines(tmp_path / "v.de", ["Eine Katze sitzt."] * 2)
    config = smoke(tmp_path, *_own_data(tmp_path), f"model_set.data.valid.prefix={tmp_path / 'v'}")
    pipe = Pipeline(config, log=lambda _: None)
    for name in STAGES:
        stamp = earlier_forms.old_fingerprint(pipe, name, "text_files")
        assert (stamp != stages.FINGERPRINTS[name](pipe)) == (name in ("reverse", "teacher", "distill", "student"))
        pipe.record(name).begin(stamp)
        pipe.record(name).finish(stamp)
    assert {action for _, action in _actions(config, len(STAGES))} == {"skipped"}
    _never_run(monkeypatch, *STAGES)
    for name in STAGES:
        assert run_stage(pipe, name)["fingerprint"] == stages.FINGERPRINTS[name](pipe)
    write_lines(tmp_path / "v.de", ["Eine Katze liegt."] * 2)
    assert _actions(config, 1) == [("reverse", "redone")]


def test_records_of_a_version_before_content_hashes_are_upgraded_once_finished_or_begun(tmp_path, monkeypatch):
    """Stamped by size and time: with these files as they were, the finished stages stay finished
    (their records upgraded, without running; `--only` a later stage first included) and a begun
    one resumes; the status says so first. A file touched since: its stage is redone."""
    from xformer_cli.pipeline import pipeline_status, stages

    config = smoke(tmp_path, *_own_data(tmp_path))
    pipe = Pipeline(config, log=lambda _: None)
    for name in ("reverse", "backtranslate"):
        stamp = earlier_forms.old_fingerprint(pipe, name, "by_time")
        pipe.record(name).begin(stamp)
        extra = {"old_fingerprint": "made-before-run-folders-moved"} if name == "reverse" else {}
        pipe.record(name).finish(stamp, lines=3, **extra)
    pipe.record("teacher").begin(earlier_forms.old_fingerprint(pipe, "teacher", "by_time"))  # killed part-way
    mono, mtime = tmp_path / "mono.de", (tmp_path / "mono.de").stat().st_mtime_ns
    os.utime(mono, ns=(mtime + 10**9, mtime + 10**9))  # the earlier version's stamp no longer holds
    assert _actions(config, 2) == [("reverse", "skipped"), ("backtranslate", "redone")]
    os.utime(mono, ns=(mtime, mtime))
    statuses = [(s.stage, s.action, s.detail) for s in pipeline_status(config)][:3]
    assert [s[:2] for s in statuses] == [("reverse", "skipped"), ("backtranslate", "skipped"), ("teacher", "resumes")]
    upgraded = "its record, from an earlier version of these inputs, upgraded"
    assert all(detail.endswith(upgraded) for *_, detail in statuses)
    _never_run(monkeypatch, "reverse", "backtranslate")
    monkeypatch.setitem(runner.RUNS, "teacher", lambda _: {"model": "<run_dir>/teacher/best.pt"})
    said: list[str] = []
    pipe = Pipeline(config, log=said.append)
    for name in ("backtranslate", "reverse", "backtranslate", "teacher"):  # `--only backtranslate` first
        run_stage(pipe, name)
    skipped = [f"stage {name}: up to date (fingerprint {stages.FINGERPRINTS[name](pipe)}), skipped"
               for name in ("reverse", "backtranslate")]
    assert said[1:4] == skipped + [f"stage teacher: resuming in {tmp_path}/run/teacher"]
    reverse = pipe.record("reverse").read()
    assert reverse["old_fingerprints"] == {"absolute": "made-before-run-folders-moved",
                                           "by_time": earlier_forms.old_fingerprint(pipe, "reverse", "by_time")}
    assert "old_fingerprint" not in reverse and reverse["fingerprint"] == stages.FINGERPRINTS["reverse"](pipe)
    assert pipe.record("teacher").read()["done"]


def test_the_oldest_records_upgrade_whole_when_a_stage_hashes_no_run_folder_path(tmp_path, monkeypatch):
    """Records from before run folders could move, the reverse model given (outside the run): its
    fingerprint is the same in both earlier forms, the teacher's (naming its run folder) only in
    the oldest, which it checks against the reverse model's oldest: every stage stays finished."""
    import torch

    given = tmp_path / "reverse.pt"
    torch.save({"config": {}}, given)
    config = smoke(tmp_path, *_own_data(tmp_path), f"reverse.checkpoint={given}")
    pipe = Pipeline(config, log=lambda _: None)
    for name in ("reverse", "backtranslate", "teacher"):
        stamp = earlier_forms.old_fingerprint(pipe, name, "absolute")
        pipe.record(name).begin(stamp)
        pipe.record(name).finish(stamp)
    assert earlier_forms.old_fingerprint(pipe, "reverse", "by_time") == pipe.record("reverse").read()["fingerprint"]
    assert earlier_forms.old_fingerprint(pipe, "teacher", "by_time") != pipe.record("teacher").read()["fingerprint"]
    _never_run(monkeypatch, "reverse", "backtranslate", "teacher")
    for name in ("reverse", "backtranslate", "teacher"):
        run_stage(pipe, name)
    assert set(pipe.record("reverse").read()["old_fingerprints"]) == {"by_time", "absolute"}


def test_a_moved_stages_last_pt_names_the_new_folders_files_and_nothing_else_changes(tmp_path):
    import torch

    from xformer_cli.checkpoint_file import load_checkpoint, save_checkpoint
    from xformer_cli.pipeline.models import follow_a_moved_run

    old, new = tmp_path / "old", tmp_path / "new"
    config = {"run_dir": f"{old}/teacher/seed-2", "tokenizer": {"model": f"{old}/teacher/tokenizer/joint.model"},
              "data": {"train": [{"prefix": "/corpus/train"}, {"prefix": f"{old}/backtranslate/synthetic"}],
                       "valid": {"prefix": f"{old}2/valid"}}}
    weights = {"w": torch.arange(4.0)}
    save_checkpoint({"config": config, "model": weights, "step": 40}, new / "teacher" / "seed-2" / "last.pt")
    said: list[str] = []
    follow_a_moved_run(new / "teacher" / "seed-2", new, said.append)
    state = load_checkpoint(new / "teacher" / "seed-2" / "last.pt")
    data = {"train": [{"prefix": "/corpus/train"}, {"prefix": f"{new}/backtranslate/synthetic"}],
            "valid": {"prefix": f"{old}2/valid"}}  # only paths in the old folder
    assert state["config"] == {"run_dir": f"{new}/teacher/seed-2",
                               "tokenizer": {"model": f"{new}/teacher/tokenizer/joint.model"}, "data": data}
    assert torch.equal(state["model"]["w"], weights["w"]) and state["step"] == 40
    assert said == [f"{new}/teacher/seed-2/last.pt: its run began in {old}; "
                    f"its config now names the same files in {new}"]
    before = (new / "teacher" / "seed-2" / "last.pt").read_bytes()
    follow_a_moved_run(new / "teacher" / "seed-2", new, said.append)  # not moved (any more): left alone
    assert (new / "teacher" / "seed-2" / "last.pt").read_bytes() == before and len(said) == 1


def _files(folder: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_status_says_what_the_next_run_does_with_each_stage_and_writes_nothing(tmp_path):
    import torch

    from xformer_cli.pipeline import pipeline_status, stages

    write_lines(tmp_path / "mono.de", ["Ein Hund läuft."] * 3)
    write_lines(tmp_path / "mono.en", ["A dog runs."] * 3)
    mono = (f"mono.target={tmp_path / 'mono.de'}", f"mono.source={tmp_path / 'mono.en'}")  # not the corpus's
    config = smoke(tmp_path, *mono)
    pipe = Pipeline(config, log=lambda _: None)
    run = tmp_path / "run"

    def said(settings=config):
        before = _files(tmp_path)
        statuses = [(s.stage, s.action, s.detail) for s in pipeline_status(settings)]
        assert _files(tmp_path) == before  # nothing written, cut or moved
        return statuses

    assert said()[0] == ("reverse", "starts", "not begun")
    assert said()[1:] == [(name, "after", f"runs after {need}") for name, need in (
        ("backtranslate", "reverse"), ("teacher", "backtranslate"), ("distill", "teacher"), ("student", "distill"),
        ("export", "student"), ("evaluate", "teacher, student, export"))]

    for name in ("reverse", "backtranslate"):
        stamp = stages.FINGERPRINTS[name](pipe)
        pipe.record(name).begin(stamp)
        pipe.record(name).finish(stamp, minutes=2.5, finished="2026-11-30T10:00:00", lines=3)
    teacher = stages.FINGERPRINTS["teacher"](pipe)
    pipe.record("teacher").begin(teacher)  # killed after its save at step 50 (logged on to 60)
    torch.save({"step": 50}, run / "teacher" / "last.pt")
    (run / "teacher" / "metrics.jsonl").write_text('{"step": 50}\n{"step": 60}\n{"step": 7')
    assert said()[:4] == [("reverse", "skipped", "2.5 min, finished 2026-11-30T10:00:00, 3 lines"),
                          ("backtranslate", "skipped", "2.5 min, finished 2026-11-30T10:00:00, 3 lines"),
                          ("teacher", "resumes", "from last.pt: teacher at step 50"),
                          ("distill", "after", "runs after teacher")]
    (run / "teacher" / "last.pt").unlink()
    assert said()[2][2] == "from last.pt: teacher nothing saved yet (from step 0)"

    pipe.record("teacher").finish(teacher, minutes=1.0, steps=50, best_valid_bleu=12.345)
    distill = stages.FINGERPRINTS["distill"](pipe)
    pipe.record("distill").begin(distill)
    write_lines(run / "distill" / "distilled.en", ["A dog."] * 4500)
    write_lines(run / "distill" / "distilled.de", ["Ein Hund."] * 4100)  # its translations
    chunk = config.distill.chunk_lines
    assert said()[2:5] == [("teacher", "skipped", "1.0 min, 50 steps, valid BLEU 12.35"),
                           ("distill", "resumes", f"after {4100 - 4100 % chunk:,} translated lines "
                                                  f"(the whole chunks of {chunk:,})"),
                           ("student", "after", "runs after distill")]

    # A record from before run folders could move: up to date, upgraded by the run, not by the status.
    pipe.record("distill").finish(distill)
    old = earlier_forms.old_fingerprint(pipe, "student", "absolute")
    pipe.record("student").begin(old)
    pipe.record("student").finish(old, model=str(run / "student" / "best.pt"))
    assert said()[4] == ("student", "redone", f"{run}/student/best.pt is gone: runs again")  # upgraded, then seen
    (run / "student" / "best.pt").write_bytes(b"weights")
    assert said()[4] == ("student", "skipped", "finished; its record, from an earlier version of these inputs, "
                                               "upgraded")
    assert said()[5] == ("export", "starts", "not begun")
    changed = smoke(tmp_path, *mono, "backtranslate.beam_size=4")
    assert [(s[0], s[1]) for s in said(changed)][:3] == [("reverse", "skipped"), ("backtranslate", "redone"),
                                                         ("teacher", "after")]
    (tmp_path / "mono.de").unlink()  # an input gone: the run stops at the first stage that reads it
    assert said()[1][:2] == ("backtranslate", "fails") and "mono.de" in said()[1][2]


def test_status_sees_a_killed_redo_put_back_and_the_stages_after_it_skipped(tmp_path, monkeypatch):
    """`--from backtranslate` with other settings, killed inside it, then called with the old
    settings: the run puts the old output back and skips every stage after it; the status says so."""
    from xformer_cli.pipeline import pipeline_status, stages

    write_lines(tmp_path / "mono.de", ["Ein Hund läuft."] * 3)
    write_lines(tmp_path / "mono.en", ["A dog runs."] * 3)
    mono = (f"mono.target={tmp_path / 'mono.de'}", f"mono.source={tmp_path / 'mono.en'}")  # not the corpus's
    config = smoke(tmp_path, *mono)
    pipe = Pipeline(config, log=lambda _: None)
    for name in ("reverse", "backtranslate", "teacher"):
        stamp = stages.FINGERPRINTS[name](pipe)
        pipe.record(name).begin(stamp)
        pipe.record(name).finish(stamp, lines=3)
    redo = Pipeline(smoke(tmp_path, *mono, "backtranslate.beam_size=4"))
    redo.record("backtranslate").begin(stages.FINGERPRINTS["backtranslate"](redo))  # the old output set aside
    assert (tmp_path / "run" / "backtranslate.replaced" / "stage.json").is_file()
    assert [(s.stage, s.action) for s in pipeline_status(config)][:4] == [
        ("reverse", "skipped"), ("backtranslate", "skipped"), ("teacher", "skipped"), ("distill", "starts")]
    assert pipeline_status(config)[1].detail.endswith("(put back from where a redo set it aside)")
    for name in ("backtranslate", "teacher"):  # and the run does what it said
        monkeypatch.setitem(runner.RUNS, name, lambda _: pytest.fail("a stage the status said is skipped ran"))
        run_stage(pipe, name)


def test_a_budget_gives_the_student_what_the_stages_before_it_leave(tmp_path, monkeypatch):
    from xformer_cli.pipeline import stages

    def student_minutes(*sets: str, spent=(28.1, 12.4, 53.0, 28.4)) -> float:
        pipe = Pipeline(smoke(tmp_path, "student.set.train.max_minutes=60", *sets), log=lambda _: None)
        for name, minutes in zip(("reverse", "backtranslate", "teacher", "distill"), spent):
            pipe.record(name).begin(f"fp-{name}")
            pipe.record(name).finish(f"fp-{name}", minutes=minutes)
        first = stages.FINGERPRINTS["student"](pipe)
        assert stages.FINGERPRINTS["student"](pipe) == first  # the same on every call: a rerun skips or resumes
        return stages.student_config(pipe).train.max_minutes

    assert student_minutes() == 60  # no budget
    assert student_minutes("budget_minutes=180") == 48.1  # 180 - 10 - 121.9: a slow CPU's translation stages
    assert student_minutes("budget_minutes=180", spent=(26.0, 4.0, 51.0, 11.0)) == 60  # a fast one: as set
    assert student_minutes("budget_minutes=180", "reserve_minutes=20") == 38.1
    with pytest.raises(XformerError, match="budget_minutes.*nothing is left for the student"):
        student_minutes("budget_minutes=120")
    said: list[str] = []
    pipe = Pipeline(smoke(tmp_path, "student.set.train.max_minutes=60", "budget_minutes=180"), log=said.append)
    monkeypatch.setattr(stages, "_train", lambda _, config: {"minutes": config.train.max_minutes})
    assert stages.run_student(pipe) == {"minutes": 48.1}
    assert said == ["student: 48.1 minutes, what budget_minutes 180 leaves after the stages before it and "
                    "reserve_minutes 10"]
    with pytest.raises(XformerError, match="budget_minutes"):
        smoke(tmp_path, "budget_minutes=-1")


def test_a_model_path_that_is_a_run_folder_or_inside_the_reverse_stage_is_refused_before_the_first_stage(tmp_path):
    """A run folder as evaluate.baseline or a distill teacher passed the check and failed at its
    stage, after every model had trained; a reverse.checkpoint inside <run_dir>/reverse was
    deleted with the folder when the stage was redone around it."""
    from xformer_cli.pipeline.checks import stage_problem

    run = tmp_path / "main-run"
    run.mkdir()
    (run / "best.pt").write_bytes(b"weights")
    for key, stage, value in (("evaluate.baseline", "evaluate", str(run)), ("distill.teachers", "distill", f"[{run}]"),
                              ("reverse.checkpoint", "reverse", str(tmp_path))):
        pipe = Pipeline(smoke(tmp_path, *_own_data(tmp_path), "teacher.seeds=[1]", f"{key}={value}"),
                        log=lambda _: None)
        given = run if key != "reverse.checkpoint" else tmp_path
        hint = f": give its checkpoint, e.g. {run / 'best.pt'}" if given == run else ""
        assert stage_problem(pipe, stage) == (f"config key '{key}': {given} is a folder, not a checkpoint or an "
                                              f"export folder{hint} (checked before the first stage runs)")
    own = tmp_path / "run" / "reverse" / "best.pt"
    own.parent.mkdir(parents=True)
    import torch

    torch.save({"config": {"data": {"src_lang": "de", "tgt_lang": "en"}}}, own)
    pipe = Pipeline(smoke(tmp_path, *_own_data(tmp_path), f"reverse.checkpoint={own}"), log=lambda _: None)
    assert stage_problem(pipe, "reverse") == (f"config key 'reverse.checkpoint': {own} lies in the reverse stage's "
                                              "own folder, which the stage sets aside and replaces: copy it out of "
                                              "the run folder first (checked before the first stage runs)")


def test_only_a_stage_whose_needed_stage_finished_with_other_inputs_is_refused(tmp_path, monkeypatch):
    """--only evaluate after --only student scored the new student beside the export of the old one."""
    from xformer_cli.pipeline import run_pipeline, stages

    config = smoke(tmp_path, *_own_data(tmp_path))
    pipe = Pipeline(config, log=lambda _: None)
    for name in STAGES:
        stamp = stages.FINGERPRINTS[name](pipe)
        pipe.record(name).begin(stamp)
        pipe.record(name).finish(stamp)
    _never_run(monkeypatch, *STAGES)
    later = "2099-01-01T00:00:00"  # the student done again: its record's time moves the export's inputs
    pipe.record("student").write({**pipe.record("student").read(), "finished": later})
    with pytest.raises(XformerError, match=r"^pipeline stage export finished with other inputs than the config gives "
                                           r"it now: run it first \(xformer pipeline -c CONFIG --from export, or "
                                           r"--only export\)$"):
        run_pipeline(config, only="evaluate", log=lambda _: None, progress=False)
    assert stages.FINGERPRINTS["student"](pipe) == pipe.record("student").read()["fingerprint"]


def test_a_redo_that_puts_the_old_output_back_promises_no_resume(tmp_path, monkeypatch):
    """A full disk in a redo of a translation stage said 'a rerun resumes there' while the old
    output was put back and the partial new one deleted (the rerun started over)."""
    from xformer_cli.pipeline import stages
    from xformer_cli.pipeline.corpus_translation import RESUMES_THERE

    pipe = Pipeline(smoke(tmp_path, *_own_data(tmp_path)), log=lambda _: None)
    pipe.record("reverse").begin("old-inputs")
    pipe.record("reverse").finish("old-inputs", model="<run_dir>/reverse/best.pt")

    def full(_):
        raise XformerError(f"could not write x: no space left on device; the lines before 513{RESUMES_THERE}")

    monkeypatch.setitem(runner.RUNS, "reverse", full)
    with pytest.raises(XformerError) as info:
        run_stage(pipe, "reverse")
    assert str(info.value) == ("could not write x: no space left on device; the lines before 513 (stage reverse: "
                               "the output of its previous inputs is kept; a rerun starts the stage over)")
    assert pipe.record("reverse").read()["fingerprint"] == "old-inputs"
    assert stages.FINGERPRINTS["reverse"](pipe) != "old-inputs"


def test_lines_past_the_models_input_length_are_one_log_line_of_a_translating_stage(tmp_path, monkeypatch):
    """The engine's UserWarning (once per place: '1 line(s)' for several) was all a stage said."""
    import warnings

    from helpers import untrained_translator
    from xformer_cli.config import DecodeConfig
    from xformer_cli.decode import factory
    from xformer_cli.pipeline import stages
    from xformer_cli.pipeline.settings import TranslateStage

    engine, lines = untrained_translator(DecodeConfig(beam_size=1, max_len_a=0.0, max_len_b=3, max_input_len=6))
    monkeypatch.setattr(factory, "load_engine", lambda *args, **kwargs: engine)
    said: list[str] = []
    pipe = Pipeline(smoke(tmp_path, *_own_data(tmp_path)), log=said.append, progress=False)
    texts = [lines[0], " ".join(lines[:3]), lines[1], " ".join(lines[1:4])]
    job = CorpusJob(texts, tmp_path / "in.en", tmp_path / "out.de", len(texts), chunk_lines=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert stages._translate(pipe, [tmp_path / "m.pt"], TranslateStage(), job) == 4
    assert not [w for w in caught if "were cut" in str(w.message)]
    assert [line for line in said if "input length" in line] == [
        "out.de: 4 line(s) longer than the model's input length (6 pieces) translated cut to it (data.max_len drops "
        "such pairs from training)"]
