"""Time and peak memory of `xformer import` on a MarianMT model of OPUS-MT's size.

Real OPUS-MT weights cannot be downloaded on the project's machines, so the model is random:
6 + 6 layers, d_model 512, 8 heads, FFN 2048, swish, a shared 58,101-piece vocabulary, written
by transformers' own save_pretrained (safetensors), with tokenizer files built like the
tests' (tests/marian_fixture.py) and vocab.json padded to 58,101 pieces.

    python scripts/bench_import.py [--workdir DIR]

Prints one line per measure: the seconds and the peak resident memory (RSS, from
getrusage of the child) of `xformer import DIR -o model.pt` run in a fresh interpreter,
and the sizes of the weights file and the checkpoint.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

VOCAB = 58101


def write_model(directory: Path) -> None:
    import torch
    import transformers

    from marian_fixture import make_marian

    make_marian(directory)  # tokenizer files of the tiny model; the weights are replaced below
    vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
    pad_piece = max(vocab, key=vocab.get)
    del vocab[pad_piece]
    for i in range(len(vocab), VOCAB - 1):
        vocab[f"▁filler{i}"] = i
    vocab[pad_piece] = VOCAB - 1
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    config = transformers.MarianConfig(
        vocab_size=VOCAB, d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
        decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048, activation_function="swish",
        max_position_embeddings=512, scale_embedding=True, pad_token_id=VOCAB - 1, eos_token_id=0,
        decoder_start_token_id=VOCAB - 1, forced_eos_token_id=0)
    torch.manual_seed(0)
    transformers.MarianMTModel(config).save_pretrained(directory)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench_import_"))
    model_dir = work / "opus-mt-size"
    write_model(model_dir)
    out = work / "model.pt"
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "xformer_cli", "import", str(model_dir), "-o", str(out)],
                          capture_output=True, cwd=ROOT)
    seconds = time.perf_counter() - start
    if proc.returncode:
        sys.exit(proc.stderr.decode())
    peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # Linux: KiB
    print(f"import seconds (wall, fresh interpreter included): {seconds:.2f}")
    print(f"import peak RSS MiB: {peak_mib:.0f}")
    print(f"model.safetensors MiB: {(model_dir / 'model.safetensors').stat().st_size / 2**20:.0f}")
    print(f"checkpoint MiB: {out.stat().st_size / 2**20:.0f}")


if __name__ == "__main__":
    main()
