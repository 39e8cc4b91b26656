"""How long a checkpoint save holds the training loop, at a model size, on this device.

A periodic save (train.save_every) writes last.pt and a kept step checkpoint. Three ways,
on the same state (weights and Adam's moments after one step), each repeated:

1. two writes, one per name (the trainer before the writer: every file written in full);
2. one write and a hard link for the second name, inline (the trainer on a CPU now);
3. the background writer (the trainer on an accelerator now): the loop waits only for the
   copy to host memory; the write itself overlaps the next steps.

    python scripts/bench_checkpoint.py                       # paper base sizes, this CPU
    python scripts/bench_checkpoint.py --device cuda --set model.d_model=1024 model.d_ff=4096 model.n_heads=16
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from xformer_cli.checkpoint_file import save_checkpoint  # noqa: E402
from xformer_cli.config import load_config  # noqa: E402
from xformer_cli.device import pick_device  # noqa: E402
from xformer_cli.model.transformer import Transformer  # noqa: E402
from xformer_cli.train.background_save import CheckpointWriter  # noqa: E402
from xformer_cli.train.step import make_optimizer  # noqa: E402

BASE = ["model.d_model=512", "model.d_ff=2048", "model.n_heads=8", "model.encoder_layers=6", "model.decoder_layers=6"]


def training_state(args, device: torch.device) -> dict:
    """A model's weights and its optimizer's state after one step, as a checkpoint holds them."""
    cfg = load_config("configs/multi30k.yaml", BASE + args.set)
    model = Transformer(cfg.model, args.vocab).to(device)
    optimizer = make_optimizer(model, cfg.train)
    src = torch.randint(4, args.vocab, (8, 12), device=device)
    model(src, src).float().sum().backward()
    optimizer.step()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 1}


def timed(save, repeats: int, device: torch.device) -> tuple[float, float]:
    """(median seconds the caller is held, median seconds until the files are on disk)."""
    held, whole = [], []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        finish = save()
        held.append(time.perf_counter() - start)
        finish()
        whole.append(time.perf_counter() - start)
    return statistics.median(held), statistics.median(whole)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", help="where to write (default: a temporary folder)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="model sizes over the paper's base")
    args = parser.parse_args()
    device = pick_device(args.device)
    state = training_state(args, device)
    mib = sum(t.numel() * t.element_size() for t in state["model"].values()) * 3 / 2**20
    if args.dir is not None:
        Path(args.dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        last, kept = Path(folder) / "last.pt", Path(folder) / "checkpoint_1.pt"

        def two_writes():
            save_checkpoint(state, last)
            save_checkpoint(state, kept)
            return lambda: None

        def write_and_link():
            save_checkpoint(state, last, also=[kept])
            return lambda: None

        writer = CheckpointWriter(background=True)

        def background():
            writer.write(state, last, [kept])
            return writer.wait

        where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
        print(f"{where}, torch {torch.__version__}; state about {mib:.0f} MiB (weights and Adam's two moments)")
        for name, save in (("two writes (before)", two_writes), ("one write + link, inline", write_and_link),
                           ("background writer", background)):
            held, whole = timed(save, args.repeats, device)
            print(f"{name:<26} loop held {held * 1e3:8.1f} ms   files on disk after {whole * 1e3:8.1f} ms")


if __name__ == "__main__":
    main()
