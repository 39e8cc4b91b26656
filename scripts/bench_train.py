"""Training-step throughput: xformer's model + loss against a plain torch.nn.Transformer loop.

Both train the same architecture (the config's sizes, tied embeddings, the same vocabulary)
on the same real batches from Multi30k, with Adam, in the same process, alternating rounds
so machine noise hits both alike. Prints target tokens/s for each and the ratio.

    python scripts/bench_train.py --config configs/multi30k.yaml --steps 20
"""

from __future__ import annotations

import argparse
import math
import platform
import time

import torch
import torch.nn.functional as F

from xformer_cli.config import load_config
from xformer_cli.data.batching import make_batches
from xformer_cli.data.sources import load_corpus
from xformer_cli.model.build import build_model
from xformer_cli.tokenizer import PAD_ID, Tokenizer
from xformer_cli.train.loss import label_smoothed_nll
from xformer_cli.train.trainer import encode_corpus


class TorchBaseline(torch.nn.Module):
    """The same sizes built from torch.nn.Transformer, with autograd's label-smoothed CE."""

    def __init__(self, vocab: int, d: int, ff: int, heads: int, enc: int, dec: int, dropout: float):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d, padding_idx=PAD_ID)
        self.core = torch.nn.Transformer(d, heads, enc, dec, ff, dropout, batch_first=True)
        self.out = torch.nn.Linear(d, vocab, bias=False)
        self.out.weight = self.embed.weight
        self.scale = math.sqrt(d)
        self.register_buffer("pe", torch.randn(1024, d) * 0.1)

    def forward(self, src, tgt_in):
        s = self.embed(src) * self.scale + self.pe[: src.size(1)]
        t = self.embed(tgt_in) * self.scale + self.pe[: tgt_in.size(1)]
        causal = self.core.generate_square_subsequent_mask(tgt_in.size(1))
        h = self.core(s, t, tgt_mask=causal, src_key_padding_mask=src == PAD_ID,
                      memory_key_padding_mask=src == PAD_ID, tgt_is_causal=True)
        return self.out(h)


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run(model, loss_fn, batches, optimizer) -> float:
    tokens = 0
    start = time.perf_counter()
    for batch in batches:
        logits = model(batch.src, batch.tgt_in)
        loss = loss_fn(logits, batch.tgt_out)
        (loss / batch.n_tokens).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        tokens += batch.n_tokens
    return tokens / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/multi30k.yaml")
    parser.add_argument("--steps", type=int, default=20, help="batches per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=6000, help="training pairs to tokenize and batch")
    args = parser.parse_args()

    cfg = load_config(args.config)
    corpus = load_corpus(cfg.data.train[0], cfg.data.src_lang, cfg.data.tgt_lang, "train")
    corpus.src, corpus.tgt = corpus.src[: args.pairs], corpus.tgt[: args.pairs]
    tokenizer = Tokenizer.train(corpus.src, corpus.tgt, joint=True, vocab_size=cfg.tokenizer.vocab_size)
    data = encode_corpus(corpus, tokenizer, cfg.data.max_len)
    index_batches = make_batches(data.src_lens, data.tgt_lens, cfg.train.max_tokens, seed=1)[: args.steps]
    batches = [data.batch(idx) for idx in index_batches]

    torch.manual_seed(0)
    ours = build_model(cfg, tokenizer).train()
    m = cfg.model
    theirs = TorchBaseline(tokenizer.src_vocab_size, m.d_model, m.d_ff, m.n_heads, m.encoder_layers,
                           m.decoder_layers, m.dropout).train()
    eps = cfg.train.label_smoothing
    ours_loss = lambda logits, gold: label_smoothed_nll(logits, gold, eps, PAD_ID)[0]  # noqa: E731
    theirs_loss = lambda logits, gold: F.cross_entropy(  # noqa: E731
        logits.reshape(-1, logits.size(-1)), gold.reshape(-1), ignore_index=PAD_ID, label_smoothing=eps, reduction="sum")
    opt_ours = torch.optim.Adam(ours.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    opt_theirs = torch.optim.Adam(theirs.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    run(ours, ours_loss, batches[:2], opt_ours)  # warm-up
    run(theirs, theirs_loss, batches[:2], opt_theirs)

    ours_rates, theirs_rates = [], []
    for _ in range(args.rounds):
        ours_rates.append(run(ours, ours_loss, batches, opt_ours))
        theirs_rates.append(run(theirs, theirs_loss, batches, opt_theirs))
    ours_best, theirs_best = max(ours_rates), max(theirs_rates)
    real = sum(b.n_tokens for b in batches)
    print(f"machine: {cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(f"config: {args.config}  params: {ours.count_parameters():,}  batches: {len(batches)} x max_tokens {cfg.train.max_tokens}"
          f"  ({real / len(batches):.0f} target tokens per batch)")
    print(f"xformer              {ours_best:8.0f} target tokens/s  (rounds: {', '.join(f'{r:.0f}' for r in ours_rates)})")
    print(f"torch.nn.Transformer {theirs_best:8.0f} target tokens/s  (rounds: {', '.join(f'{r:.0f}' for r in theirs_rates)})")
    print(f"ratio                {ours_best / theirs_best:8.2f}x")


if __name__ == "__main__":
    main()
