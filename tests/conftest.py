import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def data_root() -> Path:
    """The shared corpora: $XFORMER_DATA, else ../shared/data beside the checkout."""
    return Path(os.environ.get("XFORMER_DATA", ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def multi30k() -> Path:
    path = data_root() / "multi30k"
    if not (path / "train.en").is_file():
        pytest.fail(f"Multi30k not found at {path}; set XFORMER_DATA to the folder holding multi30k/")
    return path


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield


def write_lines(path: Path, lines) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


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


@pytest.fixture(scope="session")
def small_corpus(multi30k, tmp_path_factory):
    """A 3000-pair slice of Multi30k train plus 100 lines of valid/test."""
    root = tmp_path_factory.mktemp("m30k")
    for split, n in (("train", 3000), ("valid", 100), ("test2016", 100)):
        for lang in ("en", "de"):
            write_lines(root / f"{split}.{lang}", head(multi30k / f"{split}.{lang}", n))
    return root


def tiny_overrides(corpus, run_dir) -> list[str]:
    sets = [
        f"run_dir={run_dir}", f"data.train.prefix={corpus}/train", f"data.valid.prefix={corpus}/valid",
        f"data.test.prefix={corpus}/test2016", "tokenizer.vocab_size=1000", "model.d_model=64", "model.d_ff=128",
        "model.encoder_layers=1", "model.decoder_layers=1", "train.max_steps=30", "train.valid_every=20",
        "train.max_tokens=1500", "train.warmup_steps=10", "train.threads=1", "train.device=cpu",
        # fp32: the engine-parity tests compare against CTranslate2's float32 on this tiny,
        # barely trained model, whose near-ties bf16 training would break differently.
        "train.precision=fp32",
        "train.tune_length_penalty=[]",  # its own test (test_tune.py): keeps the other runs short
    ]
    return [arg for s in sets for arg in ("--set", s)]


@pytest.fixture(scope="session")
def trained_run(small_corpus, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    proc = xformer("train", "--config", "configs/multi30k.yaml", "--quiet", *tiny_overrides(small_corpus, run_dir))
    assert proc.returncode == 0, proc.stderr.decode()
    return run_dir




def tiny_checkpoint(multi30k: Path, path: Path, pairs: int = 30, steps: int = 100, joint: bool = True, tie: bool = True,
                    pre_norm: bool = False, layers: int = 2, decode=None) -> Path:
    """A tiny model saved as the trainer saves its checkpoints: trained on the first ``pairs``
    real Multi30k pairs for ``steps`` full-batch Adam steps (it memorises them), or, with
    steps=0, its random weights shaken so that no LayerNorm is the identity."""
    import torch.nn.functional as F

    from xformer_cli.checkpoint import build_model, save_checkpoint
    from xformer_cli.config import Config, CorpusConfig, DataConfig, DecodeConfig, TokenizerConfig
    from xformer_cli.data.batching import collate
    from xformer_cli.model.transformer import ModelConfig
    from xformer_cli.tokenizer import PAD_ID, Tokenizer

    torch.manual_seed(0)
    src, tgt = head(multi30k / "train.en", pairs), [t.strip() for t in head(multi30k / "train.de", pairs)]
    tokenizer = Tokenizer.train(src, tgt, joint=joint, vocab_size=300)
    config = Config(
        data=DataConfig(train=[CorpusConfig(prefix=str(multi30k / "train"))]),
        tokenizer=TokenizerConfig(joint=joint, vocab_size=300),
        model=ModelConfig(d_model=64, d_ff=128, n_heads=4, encoder_layers=layers, decoder_layers=layers, dropout=0.0,
                          pre_norm=pre_norm, tie_embeddings=tie),
        decode=decode or DecodeConfig(beam_size=4, length_penalty=0.6, max_len_a=1.2, max_len_b=10),
    )
    model = build_model(config, tokenizer).train()
    if steps:
        batch = collate(tokenizer.encode_src(src), tokenizer.encode_tgt(tgt))
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98))
        for _ in range(steps):
            logits = model(batch.src, batch.tgt_in)
            loss = F.cross_entropy(logits.flatten(0, 1), batch.tgt_out.flatten(), ignore_index=PAD_ID)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
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
