"""CTranslate2 export: the exported model decodes like the checkpoint it came from."""

import json
import sys

import pytest
import torch

from xformer_cli.decode.translator import Translator
from xformer_cli.errors import XformerError

from helpers import head, tiny_checkpoint

pytestmark = pytest.mark.slow  # every test exports a model trained on Multi30k

pytest.importorskip("ctranslate2")
from xformer_cli.decode.ct2_engine import CPU_JOB_SENTENCES, CTranslate2Translator  # noqa: E402
from xformer_cli.export.ctranslate2 import MISSING_CT2, export_ctranslate2  # noqa: E402

N_TRAIN = 30  # memorised pairs: confident, real German outputs
N_UNSEEN = 12  # unseen test sentences: the model's guesses, decoded identically all the same
STEPS = 100


def _train_checkpoint(multi30k, path, pre_norm: bool, joint: bool, restrict: bool = False):
    """A tiny model that memorised N_TRAIN real pairs; its sentences (seen, then unseen)."""
    tiny_checkpoint(multi30k, path, pairs=N_TRAIN, steps=STEPS, joint=joint, pre_norm=pre_norm, restrict=restrict)
    return path, head(multi30k / "train.en", N_TRAIN) + head(multi30k / "test2016.en", N_UNSEEN)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Two torch threads on two busy cores spin far more than they compute."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module", params=[("post-norm", "joint"), ("pre-norm", "separate"), ("post-norm", "restricted")],
                ids=lambda p: "-".join(p))
def exported(request, multi30k, tmp_path_factory):
    """restricted: a joint vocabulary whose output layer scores the target side's pieces (the
    others go out as -inf in the projection's bias)."""
    norm, vocab = request.param
    root = tmp_path_factory.mktemp(f"{norm}-{vocab}")
    checkpoint, sentences = _train_checkpoint(multi30k, root / "last.pt", norm == "pre-norm", vocab != "separate",
                                              vocab == "restricted")
    out = export_ctranslate2(checkpoint, root / "ct2")
    return checkpoint, out, sentences


def test_greedy_outputs_and_scores_equal_xformer(exported):
    checkpoint, out, sentences = exported
    reference = Translator.from_checkpoint(checkpoint, device="cpu")
    ct2 = CTranslate2Translator.from_directory(out, threads=1)
    expected = reference.translate(sentences, beam_size=1)
    got = ct2.translate(sentences, beam_size=1)
    assert len(got) == len(sentences) >= 20
    assert got == expected
    assert sum(line in expected[:N_TRAIN] for line in got) > N_TRAIN // 2  # outputs are real, varied German
    assert len(set(got)) > N_TRAIN // 2

    # The same tokens, and the same summed log-probabilities (eos included) up to the mass
    # of pad and bos: CTranslate2 renormalises without them, xformer masks them after its
    # log-softmax. The memorised sentences all end before the length limit (where CTranslate2
    # would score the uncut hypothesis).
    ours = reference.search(sentences, reference.options(beam_size=1))
    theirs = [hyps[0] for hyps in ct2.search(sentences, ct2.options(beam_size=1))]
    assert [h.tokens for h in theirs] == [h.tokens for (h,) in ours]
    for mine, (hyp,) in zip(theirs[:N_TRAIN], ours[:N_TRAIN]):
        assert mine.logprob == pytest.approx(hyp.logprob, abs=5e-3)
        assert mine.score == pytest.approx(hyp.score, abs=5e-3)  # over the same length penalty


def test_a_minimum_length_past_the_limit_ends_at_the_limit_on_both_engines(exported):
    """--min-len 500 with --max-len-b 3: the limit wins on either engine (CTranslate2 refused a
    minimum above its maximum with a ValueError), and greedy search gives the same lines."""
    checkpoint, out, sentences = exported
    reference = Translator.from_checkpoint(checkpoint, device="cpu")
    ct2 = CTranslate2Translator.from_directory(out, threads=1)
    options = dict(beam_size=1, min_len=500, max_len_a=0.0, max_len_b=3)
    ours = reference.search(sentences[:4], reference.options(**options))
    theirs = ct2.search(sentences[:4], ct2.options(**options))
    assert [hyps[0].tokens for hyps in theirs] == [h.tokens for (h,) in ours]
    assert all(len(h.tokens) == 3 for (h,) in ours)


def test_beam_search_where_the_length_limits_bind_does_not_depend_on_the_batch(exported):
    """CTranslate2 decodes a batch to its longest line's limit: a beam of a shorter line that
    reached its own limit went on past it, and its cut result changed with its batch-mates."""
    _, out, sentences = exported
    ct2 = CTranslate2Translator.from_directory(out, threads=1)
    options = dict(beam_size=4, max_len_a=0.6, max_len_b=0)
    alone = [ct2.translate([line], **options)[0] for line in sentences]
    assert ct2.translate(sentences, batch_size=64, **options) == alone
    loose = ct2.translate(sentences, beam_size=4)
    assert sum(cut != whole for cut, whole in zip(alone, loose)) > len(sentences) // 2  # the limits bind


def test_cpu_threads_run_parallel_batches_and_every_line_keeps_its_place(exported):
    """On a CPU the threads are CTranslate2 workers, each taking jobs of a few sentences, with
    the next engine batch queued before the last is read: the lines must come back in place."""
    _, out, sentences = exported
    ct2 = CTranslate2Translator.from_directory(out, threads=2)
    assert ct2.translator.num_translators == 2 and (ct2.job_sentences, ct2.workers) == (CPU_JOB_SENTENCES, 2)
    assert [ct2._job_size(n) for n in (256, 40, 9, 1)] == [CPU_JOB_SENTENCES, 20, 5, 1]  # both workers get a share
    alone = [ct2.translate([line], beam_size=1)[0] for line in sentences]  # one job a line
    ct2.job_sentences = 3  # engine batches of 8 in jobs of 3
    many = sentences * 3
    assert ct2.translate(many, beam_size=1, batch_size=8) == alone * 3
    assert len(set(alone)) > N_TRAIN // 2


def test_a_line_withdrawn_while_a_batch_decodes_is_not_queued_after_it(exported):
    _, out, sentences = exported
    ct2 = CTranslate2Translator.from_directory(out, threads=2)
    opts = ct2.options(beam_size=1, batch_size=4)
    found = ct2.search(sentences, opts, wanted=lambda i: i < 5)
    assert all(found[i] for i in range(5) if sentences[i].strip()) and not any(found[5:])

    read, reading = [], ct2._read
    def read_and_leave(*args):  # every client leaves once the first batch has been read
        reading(*args)
        read.append(True)
    ct2._read = read_and_leave
    found = ct2.search(sentences, opts, wanted=lambda i: not read)
    assert sum(bool(hyps) for hyps in found) == 4  # the first batch only: the second was not queued ahead


def test_a_failing_batch_waits_for_the_batch_queued_behind_it(exported, monkeypatch):
    from xformer_cli.decode import ct2_engine

    _, out, sentences = exported
    ct2 = CTranslate2Translator.from_directory(out, threads=2)
    waited, wait = [], ct2_engine._Queued.wait
    monkeypatch.setattr(ct2_engine._Queued, "wait", lambda queued: waited.append(len(queued.lines)) or wait(queued))
    def fail(*args):
        raise RuntimeError("scoring failed")
    ct2._ranked = fail
    with pytest.raises(RuntimeError, match="scoring failed"):
        ct2.search(sentences * 4, ct2.options(beam_size=4, batch_size=16))
    assert waited == [16, 16]  # the batch being read and the one behind it: nothing left running


def test_files_of_an_export(exported):
    _, out, _ = exported
    names = {p.name for p in out.iterdir()}
    assert {"model.bin", "config.json", "xformer_export.json"} <= names
    assert names & {"spm.model", "source.spm.model"}
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no staging directory left


def test_beam_search_gives_one_line_per_input_line(exported):
    checkpoint, out, sentences = exported
    ct2 = CTranslate2Translator.from_directory(out, threads=1)
    lines = ["", sentences[0], "   ", sentences[1] + "\n", "\t", sentences[2]]
    got = ct2.translate(lines, beam_size=4, batch_size=2)
    assert len(got) == len(lines)
    assert got[0] == got[2] == got[4] == ""
    assert all(got[i] for i in (1, 3, 5))
    assert got[1] == ct2.translate([sentences[0]], beam_size=4)[0]  # batching does not change results

    # Not guaranteed equal to xformer's beam (the stopping rules differ), but close.
    reference = Translator.from_checkpoint(checkpoint, device="cpu")
    expected = reference.translate(sentences, beam_size=4, length_penalty=0.6)
    got = ct2.translate(sentences, beam_size=4, length_penalty=0.6)
    assert sum(a == b for a, b in zip(got, expected)) >= 0.9 * len(sentences)


def test_quantized_export_translates(exported, tmp_path):
    checkpoint, _, sentences = exported
    out = export_ctranslate2(checkpoint, tmp_path / "int8", quantization="int8")
    got = CTranslate2Translator.from_directory(out).translate(sentences[:5] + [""], beam_size=2)
    assert len(got) == 6 and got[-1] == "" and all(got[:5])


def test_existing_directory_is_refused_and_left_untouched(exported, tmp_path):
    checkpoint, _, _ = exported
    target = tmp_path / "model"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    with pytest.raises(XformerError, match="not empty") as info:
        export_ctranslate2(checkpoint, target)
    assert "\n" not in str(info.value)
    assert [p.name for p in target.iterdir()] == ["keep.txt"] and (target / "keep.txt").read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]

    with pytest.raises(XformerError, match="holds files that are not an xformer export: --force replaces an earlier"):
        export_ctranslate2(checkpoint, target, force=True)  # the folder is the user's: it would be deleted
    assert [p.name for p in target.iterdir()] == ["keep.txt"]

    (target / "keep.txt").unlink()
    export_ctranslate2(checkpoint, target)
    (target / "notes.txt").write_text("mine")  # beside an export: --force deleted them with it
    (target / "results").mkdir()
    with pytest.raises(XformerError, match=r"holds notes.txt, results/ beside an earlier export: --force replaces "
                                           "the export only"):
        export_ctranslate2(checkpoint, target, force=True)
    assert (target / "notes.txt").read_text() == "mine" and (target / "results").is_dir()
    (target / "notes.txt").unlink()
    (target / "results").rmdir()
    info = json.loads((target / "xformer_export.json").read_text())
    del info["files"]  # an export from before the list: the names either format writes are its own
    (target / "xformer_export.json").write_text(json.dumps(info))
    (target / "vmap.txt").write_text("its shortlist")
    export_ctranslate2(checkpoint, target, force=True)  # an earlier export: replaced
    assert not (target / "vmap.txt").exists() and (target / "model.bin").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_an_output_that_links_to_a_folder_is_written_at_its_target(exported, tmp_path):
    """The link was replaced by a folder of its own, the target left empty (or stale)."""
    checkpoint, _, _ = exported
    (tmp_path / "store" / "v1").mkdir(parents=True)
    (tmp_path / "current").symlink_to(tmp_path / "store" / "v1")
    export_ctranslate2(checkpoint, tmp_path / "current")
    assert (tmp_path / "current").is_symlink() and (tmp_path / "store" / "v1" / "model.bin").is_file()
    export_ctranslate2(checkpoint, tmp_path / "current", force=True)
    assert (tmp_path / "current").is_symlink() and (tmp_path / "store" / "v1" / "model.bin").is_file()


def test_force_never_replaces_the_folder_that_holds_the_checkpoint(exported, tmp_path):
    """Its run folder, or a parent of it, would be deleted with every checkpoint in it."""
    checkpoint, _, _ = exported
    run = tmp_path / "parent" / "run"
    run.mkdir(parents=True)
    inside = run / "best.pt"
    inside.write_bytes(checkpoint.read_bytes())
    (run / "xformer_export.json").write_text("{}")  # even where it looks like an export
    for target in (run, tmp_path / "parent"):
        with pytest.raises(XformerError, match="holds the checkpoint being exported .*: --force would delete it"):
            export_ctranslate2(inside, target, force=True)
    assert inside.read_bytes() == checkpoint.read_bytes()


def test_bad_inputs_are_one_line_errors(exported, tmp_path):
    checkpoint, out, _ = exported
    truncated = tmp_path / "cut.pt"
    truncated.write_bytes(checkpoint.read_bytes()[:2000])
    with pytest.raises(XformerError, match="not a readable xformer checkpoint"):
        export_ctranslate2(truncated, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(XformerError, match="quantization"):
        export_ctranslate2(checkpoint, tmp_path / "out", quantization="int3")
    assert not (tmp_path / "out").exists()
    for missing in (tmp_path / "nowhere", tmp_path):
        with pytest.raises(XformerError, match=str(missing)):
            CTranslate2Translator.from_directory(missing)


def test_a_damaged_vocabulary_file_is_named_when_the_export_loads(exported, tmp_path):
    """It was a ValueError from the first translation ("Token <pad> is not in the vocabulary")."""
    import shutil

    _, out, _ = exported
    damaged = tmp_path / "damaged"
    shutil.copytree(out, damaged)
    vocabulary = next(damaged.glob("*vocabulary.json"))
    vocabulary.write_text('["a"]')
    with pytest.raises(XformerError, match=rf"^{vocabulary} holds 1 pieces, not the \d+ of the export's "
                                           r"sentencepiece model: export the checkpoint again$"):
        CTranslate2Translator.from_directory(damaged, threads=1)


def test_missing_ctranslate2_is_a_clear_error(exported, tmp_path, monkeypatch):
    checkpoint, out, _ = exported
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import ctranslate2 -> ImportError
    with pytest.raises(XformerError) as info:
        export_ctranslate2(checkpoint, tmp_path / "out")
    assert str(info.value) == MISSING_CT2
    with pytest.raises(XformerError, match="pip install"):
        CTranslate2Translator.from_directory(out)


def test_both_engines_answer_one_interface(exported):
    from xformer_cli.decode.factory import load_engine

    checkpoint, out, sentences = exported
    engines = [load_engine(checkpoint, device="cpu", precision="fp32", threads=1)]
    engines.append(load_engine(out, engine="ctranslate2", threads=2))
    assert torch.get_num_threads() == 1  # CTranslate2's load (its OpenMP is torch's) left torch's count alone
    for engine in engines:
        found = engine.search(sentences[:4] + [""], engine.options(beam_size=3, nbest=3))
        assert [len(hyps) for hyps in found] == [3, 3, 3, 3, 0], engine.name
        assert all(h[0].score >= h[1].score >= h[2].score for h in found[:4])
        assert engine.translate(sentences[:4], beam_size=3) == [engine.detokenize(h[0]) for h in found[:4]]
    greedy = [engine.translate(sentences, beam_size=1) for engine in engines]
    assert greedy[0] == greedy[1]
    with pytest.raises(XformerError, match="ctranslate2 engine does not support --sampling-topk"):
        engines[1].options(beam_size=1, sampling_topk=5)
