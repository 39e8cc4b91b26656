"""Functions the test modules share: running the CLI, checking its one-line errors, small
files and tiny configs and checkpoints. Fixtures live in conftest.py; this module has none."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterable, Optional

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def data_root() -> Path:
    """The shared corpora: $XFORMER_DATA, else ../shared/data beside the checkout."""
    return Path(os.environ.get("XFORMER_DATA", ROOT.parent / "shared" / "data"))


def write_lines(path: Path, lines: Iterable[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def pairs_sets(folder: Path, pairs: list[tuple[str, str]], vocab_size: int = 100) -> list[str]:
    """--set overrides of a config that trains on ``pairs`` (written to folder/t.en, t.de) with
    no valid or test set and a tiny vocabulary: for tests of what the token cache holds."""
    write_lines(folder / "t.en", [src for src, _ in pairs])
    write_lines(folder / "t.de", [tgt for _, tgt in pairs])
    return [f"run_dir={folder / 'run'}", f"data.train={json.dumps({'prefix': str(folder / 't')})}",
            "data.valid=null", "data.test=null", f"tokenizer.vocab_size={vocab_size}"]


def head(path: Path, n: int) -> list[str]:
    with open(path, encoding="utf-8") as handle:
        return [next(handle).rstrip("\n") for _ in range(n)]


def xformer(*args, stdin: bytes | None = None, python_prelude: str | None = None) -> subprocess.CompletedProcess:
    """Run the CLI in a fresh interpreter, as a user would."""
    if python_prelude is None:
        command = [sys.executable, "-m", "xformer_cli"]
    else:  # run some Python first (e.g. hide a module), then the CLI
        command = [sys.executable, "-c", python_prelude + "\nfrom xformer_cli.cli import app\napp(prog_name='xformer')"]
    return subprocess.run([*command, *map(str, args)], input=stdin, capture_output=True, cwd=ROOT, timeout=600)


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    err = proc.stderr.decode()
    assert proc.returncode != 0, err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    # Progress lines (tokenizer trained, ...) may come first; the error is one line, the last.
    assert lines and lines[-1].startswith("error: "), err
    assert sum(line.startswith("error") for line in lines) == 1, err
    for fragment in fragments:
        assert fragment in lines[-1], err


def tiny_overrides(corpus: Path, run_dir: Path) -> list[str]:
    """``--set`` arguments that shrink configs/multi30k.yaml to a run of seconds on ``corpus``."""
    sets = [
        f"run_dir={run_dir}", f"data.train.prefix={corpus}/train", f"data.valid.prefix={corpus}/valid",
        f"data.test.prefix={corpus}/test2016", "tokenizer.vocab_size=1000", "model.d_model=64", "model.d_ff=128",
        "model.encoder_layers=1", "model.decoder_layers=1", "train.max_steps=30", "train.valid_every=20",
        "train.max_tokens=1500", "train.warmup_steps=10", "train.threads=1", "train.device=cpu",
        # fp32: the engine-parity tests compare against CTranslate2's float32 on this tiny,
        # barely trained model, whose near-ties bf16 training would break differently.
        "train.precision=fp32",
        "train.tune_length_penalty=[]",  # its own test (test_tune.py): keeps the other runs short
        # the paper's schedule and valid_every: the budgeted one (cool-down, planned validations)
        # has its own tests (test_time_budget.py), which set it as the default config does
        "train.cooldown=0", "train.validations=0",
    ]
    return [arg for s in sets for arg in ("--set", s)]


def tiny_config(corpus: Path, run_dir: Path, **changes):
    """The in-process trainer's tiny config: tiny_overrides, smaller batches, a log line a step."""
    from xformer_cli.config import load_config

    sets = dict(s.split("=", 1) for s in tiny_overrides(corpus, run_dir)[1::2])
    sets.update({"model.dropout": "0.1", "train.max_tokens": "600", "train.log_every": "1", "train.valid_every": "6",
                 "data.valid_max_sentences": "8", "decode.max_len_a": "0.5", "decode.max_len_b": "3"})
    sets.update({k: str(v) for k, v in changes.items()})
    return load_config("configs/multi30k.yaml", [f"{k}={v}" for k, v in sets.items()])


def losses(run_dir: Path) -> dict[int, float]:
    """Step -> logged training loss, from a run's metrics.jsonl."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train_loss"] for r in rows if "train_loss" in r}


def quiet(_: str) -> None:
    pass


def tiny_checkpoint(multi30k: Path, path: Path, pairs: int = 30, steps: int = 100, joint: bool = True, tie: bool = True,
                    pre_norm: bool = False, layers: int = 2, decode: Optional[object] = None,
                    restrict: bool = False) -> Path:
    """A tiny model saved as the trainer saves its checkpoints: trained on the first ``pairs``
    real Multi30k pairs for ``steps`` full-batch Adam steps (it memorises them), or, with
    steps=0, its random weights shaken so that no LayerNorm is the identity. ``restrict``: its
    output layer scores only the pieces of those pairs' target side (model.restrict_output)."""
    from xformer_cli.checkpoint_file import build_model, save_checkpoint
    from xformer_cli.config import Config, CorpusConfig, DataConfig, DecodeConfig, TokenizerConfig
    from xformer_cli.model.transformer import ModelConfig
    from xformer_cli.tokenizer import Tokenizer
    from xformer_cli.train.output_pieces import target_pieces

    torch.manual_seed(0)
    src, tgt = head(multi30k / "train.en", pairs), [t.strip() for t in head(multi30k / "train.de", pairs)]
    tokenizer = Tokenizer.train(src, tgt, joint=joint, vocab_size=300)
    pieces = target_pieces([i for line in tokenizer.encode_tgt(tgt) for i in line], tokenizer.tgt_vocab_size)
    config = Config(
        data=DataConfig(train=[CorpusConfig(prefix=str(multi30k / "train"))]),
        tokenizer=TokenizerConfig(joint=joint, vocab_size=300),
        model=ModelConfig(d_model=64, d_ff=128, n_heads=4, encoder_layers=layers, decoder_layers=layers, dropout=0.0,
                          pre_norm=pre_norm, tie_embeddings=tie),
        decode=decode or DecodeConfig(beam_size=4, length_penalty=0.6, max_len_a=1.2, max_len_b=10),
    )
    model = build_model(config, tokenizer, pieces if restrict else None).train()
    config.model = model.cfg  # restrict_output and output_pieces, as the checkpoint records them
    if steps:
        _memorise(model, tokenizer, src, tgt, steps)
    else:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.2 * torch.randn_like(p))
    save_checkpoint({
        "config": config.to_dict(),
        "tokenizer": {"src": tokenizer.src_model_bytes, "tgt": tokenizer.tgt_model_bytes},
        "model": model.state_dict(),
        "step": steps,
    }, path)
    return path


def untrained_translator(decode=None):
    """A Translator over a 1+1-layer untrained model and a 40-piece tokenizer of one shuffled
    sentence: for what a search or the API does with lines, not for what it writes."""
    from xformer_cli.config import DecodeConfig
    from xformer_cli.decode.translator import Translator
    from xformer_cli.model.transformer import ModelConfig, Transformer
    from xformer_cli.tokenizer import Tokenizer

    words = "a dog runs in the park while two men sit on a bench near the water".split()
    lines = [" ".join(words[i:] + words[:i]) for i in range(len(words))]
    tokenizer = Tokenizer.train(lines, lines, joint=True, vocab_size=40)
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, d_ff=64, n_heads=4, encoder_layers=1, decoder_layers=1, dropout=0.0)
    model = Transformer(cfg, src_vocab=tokenizer.src_vocab_size)
    decode = decode or DecodeConfig(beam_size=2, max_len_a=1.0, max_len_b=5, batch_size=2)
    return Translator(model, tokenizer, decode, torch.device("cpu")), lines


def _memorise(model: torch.nn.Module, tokenizer, src: list[str], tgt: list[str], steps: int) -> None:
    """Full-batch Adam on the pairs, no label smoothing: the model learns them by heart."""
    import torch.nn.functional as F

    from xformer_cli.data.batching import collate
    from xformer_cli.tokenizer import PAD_ID

    batch = collate(tokenizer.encode_src(src), tokenizer.encode_tgt(tgt))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98))
    for _ in range(steps):
        logits = model(batch.src, batch.tgt_in)
        loss = F.cross_entropy(logits.flatten(0, 1), model.scored_targets(batch.tgt_out).flatten(), ignore_index=PAD_ID)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


class FsyncSpy:
    """Records what each os.fsync call synced (the path behind the descriptor) and, for a
    directory, which names were in it at that moment."""

    def __init__(self, monkeypatch):
        if not Path("/proc/self/fd").is_dir():
            pytest.skip("needs /proc to tell which file a descriptor is")
        self.calls: list[tuple[Path, list[str]]] = []
        self._real = os.fsync
        monkeypatch.setattr(os, "fsync", self)

    def __call__(self, fd: int) -> None:
        path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        self.calls.append((path, sorted(p.name for p in path.iterdir()) if path.is_dir() else []))
        self._real(fd)

    def paths(self) -> list[Path]:
        return [path for path, _ in self.calls]


def signal_after_step(trainer, step: int, monkeypatch) -> None:
    """SIGTERM this process once ``trainer`` has finished step ``step``, as Ctrl-C or a job
    scheduler would: the trainer finishes the step, saves and stops."""
    import os
    import signal

    real_step = trainer.train_step

    def step_then_signal(group):
        done = real_step(group)
        if trainer.counters.step == step:
            os.kill(os.getpid(), signal.SIGTERM)
        return done

    monkeypatch.setattr(trainer, "train_step", step_then_signal)
