"""``translate`` and ``eval-bleu`` read the checkpoint once: the engine loads it and knows its
languages and config; the CLI and the text pipeline ask the engine (issue 50, item 10). They
used to read it again for the languages before the engine was built, eval-bleu up to four
times (multilingual?, the test set, the direction, the number words' languages)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from multilingual_fixture import corpus, checkpoint  # noqa: F401 (module fixtures)
from multilingual_fixture import multilingual_checkpoint, parallel_lines


@pytest.fixture(scope="module")
def bilingual(corpus, tmp_path_factory) -> Path:  # noqa: F811
    return multilingual_checkpoint(corpus, tmp_path_factory.mktemp("bi") / "en-de.pt", pairs=("en-de",))


def reads_of(monkeypatch, path: Path) -> list:
    """Every ``torch.load`` of ``path`` from now on (load_checkpoint's and any mmap'd peek)."""
    reads = []
    real = torch.load

    def load(f, *args, **kwargs):
        if isinstance(f, (str, Path)) and Path(f).resolve() == path.resolve():
            reads.append(kwargs.get("mmap", False))
        return real(f, *args, **kwargs)

    monkeypatch.setattr(torch, "load", load)
    return reads


def cli(*args, stdin: str = ""):
    """The CLI in this process (typer's runner): the unit tier starts no process."""
    from typer.testing import CliRunner

    from xformer_cli.cli import app

    result = CliRunner().invoke(app, [str(a) for a in args], input=stdin)
    assert result.exit_code == 0, result.output
    return result


def test_translate_reads_the_checkpoint_once(bilingual, checkpoint, monkeypatch):  # noqa: F811
    for model, more in ((bilingual, ()), (checkpoint, ("-t", "fr"))):
        reads = reads_of(monkeypatch, model)
        out = cli("translate", "-m", model, "--engine", "xformer", "-b", "1", *more, stdin="A man rides.\n\nA dog.\n")
        assert len(out.stdout.splitlines()) == 3 and len(reads) == 1, (model.name, reads)


def test_ctranslate2_on_a_checkpoint_reads_it_once(bilingual, monkeypatch):
    """Exported at start: the export's read gives the engine its config (eval-bleu's test set) too."""
    pytest.importorskip("ctranslate2")
    reads = reads_of(monkeypatch, bilingual)
    cli("translate", "-m", bilingual, "--engine", "ctranslate2", "-b", "1", stdin="A man rides.\n")
    assert len(reads) == 1, reads
    reads = reads_of(monkeypatch, bilingual)
    cli("eval-bleu", "-m", bilingual, "--engine", "ctranslate2", "-b", "1")
    assert len(reads) == 1, reads


def test_eval_bleu_reads_the_checkpoint_once(bilingual, checkpoint, corpus, tmp_path, monkeypatch):  # noqa: F811
    reads = reads_of(monkeypatch, bilingual)  # its config's test set, translated and scored with number accuracy
    alone = cli("eval-bleu", "-m", bilingual, "--engine", "xformer", "-b", "1", "--json")
    assert "BLEU" in json.loads(alone.stdout.splitlines()[-1]) and len(reads) == 1, reads
    reads = reads_of(monkeypatch, bilingual)
    src, ref = tmp_path / "src.en", tmp_path / "ref.de"
    lines = parallel_lines(4, 9)
    src.write_text("".join(line + "\n" for line in lines["en"]), encoding="utf-8")
    ref.write_text("".join(line + "\n" for line in lines["de"]), encoding="utf-8")
    cli("eval-bleu", "-m", bilingual, "--src", src, "--ref", ref, "--engine", "xformer", "-b", "1")
    assert len(reads) == 1, reads
    reads = reads_of(monkeypatch, checkpoint)  # every direction's test set, one row each
    rows = cli("eval-bleu", "-m", checkpoint, "--engine", "xformer", "-b", "1", "--json")
    assert len(json.loads(rows.stdout.splitlines()[-1])["directions"]) == 2 and len(reads) == 1, reads


def test_eval_bleu_output_never_replaces_a_reference_or_a_file_before_the_checks(bilingual, tmp_path, monkeypatch):
    """--output on a --ref (or on the test set's file the checkpoint scores alone) would overwrite the
    reference with the translation; a line count that differs fails before the translation is written
    over an existing output. The files given are checked before the model loads."""
    from typer.testing import CliRunner

    from xformer_cli.cli import app

    src, ref, out = tmp_path / "src.en", tmp_path / "ref.de", tmp_path / "out.de"
    lines = parallel_lines(4, 9)
    src.write_text("".join(line + "\n" for line in lines["en"]), encoding="utf-8")
    ref.write_text("".join(line + "\n" for line in lines["de"]), encoding="utf-8")
    out.write_text("kept\n", encoding="utf-8")
    short = tmp_path / "short.de"
    short.write_text(lines["de"][0] + "\n", encoding="utf-8")
    base = ["eval-bleu", "-m", str(bilingual), "--src", str(src), "--engine", "xformer", "-b", "1"]
    reads = reads_of(monkeypatch, bilingual)
    result = CliRunner().invoke(app, [*base, "--ref", str(ref), "-o", str(ref)])
    assert result.exit_code == 1 and f"--output {ref} is the --ref file" in result.output, result.output
    result = CliRunner().invoke(app, [*base, "--ref", str(short), "-o", str(out)])
    assert result.exit_code == 1 and f"line counts differ: {src} has 4 lines, {short} has 1" in result.output
    assert ref.read_text(encoding="utf-8").splitlines() == lines["de"] and out.read_text() == "kept\n"
    assert reads == []  # both refused before the model loaded
    from xformer_cli.data.directions import checkpoint_test_set

    test_files = checkpoint_test_set(bilingual, log=lambda _: None).files  # --checkpoint alone: its config's
    before = test_files[1].read_bytes()
    result = CliRunner().invoke(app, ["eval-bleu", "-m", str(bilingual), "-b", "1", "-o", str(test_files[1])])
    assert result.exit_code == 1 and f"--output {test_files[1]} is the data.test file" in result.output, result.output
    assert test_files[1].read_bytes() == before


def test_options_are_checked_before_the_model_loads(tmp_path):
    """The engine now loads before the direction is chosen; what needs no model is still said first."""
    from typer.testing import CliRunner

    from xformer_cli.cli import app

    missing, ref = tmp_path / "missing.pt", tmp_path / "ref.de"
    ref.write_text("Ein Mann.\n", encoding="utf-8")
    for args, message in ((("translate", "-m", missing, "--format", "xml"), "--format must be one of"),
                          (("translate", "-m", missing, "--chunk-lines", "0"), "--chunk-lines must be at least 1"),
                          (("eval-bleu", "-m", missing, "--ref", ref), "--checkpoint needs --src"),
                          (("eval-bleu", "-m", missing, "--src", ref), "give --ref")):
        result = CliRunner().invoke(app, [str(a) for a in args], input="A man.\n")
        assert result.exit_code == 1 and message in result.output, result.output


def test_an_output_inside_an_export_given_or_on_a_checkpoint_is_refused_before_any_work(bilingual, tmp_path):
    """translate -o ex/model.bin destroyed the export it translated with, -o run/last.pt the run's
    resume point; both were written with exit 0."""
    from typer.testing import CliRunner

    from xformer_cli.cli import app

    export, last = tmp_path / "ct2", tmp_path / "last.pt"
    export.mkdir()
    (export / "model.bin").write_bytes(b"weights")
    last.write_bytes(b"a checkpoint")
    src, ref = tmp_path / "src.en", tmp_path / "ref.de"
    src.write_text("A man.\n", encoding="utf-8")
    ref.write_text("Ein Mann.\n", encoding="utf-8")
    for args, said in ((("translate", "-m", export, "-i", src, "-o", export / "model.bin"), "inside the --checkpoint"),
                       (("eval-bleu", "-m", export, "--src", src, "-r", ref, "-o", export / "new.de"), "inside the"),
                       (("translate", "-m", bilingual, "-i", src, "-o", last), "is a checkpoint file")):
        result = CliRunner().invoke(app, [str(a) for a in args])
        assert result.exit_code == 1 and said in result.output, result.output
    assert (export / "model.bin").read_bytes() == b"weights" and last.read_bytes() == b"a checkpoint"
    assert sorted(p.name for p in export.iterdir()) == ["model.bin"]
