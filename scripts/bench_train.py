"""Training throughput and model FLOP utilisation, against peers measured in the same run.

1. Model loop: xformer's model + loss, in fp32 and in the precision ``auto`` picks on this
   machine (bf16 where the hardware has it), against a plain torch.nn.Transformer loop (fp32).
   All train the same architecture (the config's sizes, tied embeddings, the same
   vocabulary) on the same real batches, each update the trainer's own (``TrainStep``: fused
   Adam, the config's clipping, the loss scaler at fp16), in the same process, alternating
   rounds so machine noise hits them alike. Prints target tokens/s, achieved FLOP/s (counted by
   torch's FlopCounterMode) and MFU against large fp32 and bf16 matmuls timed in the same
   process; no MFU against a precision this machine emulates (``emulated_reason``: from the
   CPU flags or the CUDA compute capability, else measured: a native bf16 outruns fp32),
   whose "peak" is no ceiling (an AVX2-only CPU timed 0.3 GFLOP/s of bf16). Also the conventional MFU (6 x N x target tokens/s over the device's spec dense
   bf16 peak, N = the parameters of every matmul, output projection included; CUDA only), and
   the launch cost of one training step: kernels per step on CUDA (torch.profiler), aten ops
   per step on a CPU (train/opcount.py, on the code path CUDA takes with the trainer's
   half-weight cache at bf16, fake tensors; scripts/bench_opcount.py has the table).
2. Whole trainers (--trainer-steps N): ``xformer train`` with train.precision fp32 and auto
   and, with --onmt-venv, OpenNMT-py 3.5.1's ``onmt_train`` (scripts/peers/setup_opennmt.sh;
   fp32: it has no CPU bf16 training) on the same architecture and max_tokens, one after
   the other; steady-state target tokens/s from their own logs (the first report, start-up,
   is dropped).

    python scripts/bench_train.py --config configs/multi30k.yaml --steps 15
    python scripts/bench_train.py --steps 15 --trainer-steps 60 --onmt-venv /tmp/onmt-venv
    python scripts/bench_train.py --steps 6 --set model.d_model=512 model.d_ff=2048 \
        model.n_heads=8 model.encoder_layers=6 model.decoder_layers=6   # paper-base sizes
    python scripts/bench_train.py --device cuda --compile --length-bucket 8 --set ...
        # the trainer's compiled step (train/forward_loss.py) on bucketed batches: CUDA graphs
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from xformer_cli.config import load_config
from xformer_cli.data.sources import load_corpus
from xformer_cli.device import autocast, computes_natively, cpu_flags, keep_freed_memory, pick_device, resolve_precision
from xformer_cli.checkpoint_file import build_model
from xformer_cli.tokenizer import PAD_ID, Tokenizer
from xformer_cli.train.epoch_batches import plan_for
from xformer_cli.train.distributed import Distributed
from xformer_cli.train.forward_loss import compilations, compile_mode, forward_loss, wants_half_weights
from xformer_cli.train.opcount import cuda_path_step_ops
from xformer_cli.train.step import TrainStep
from xformer_cli.train.output_pieces import target_pieces
from xformer_cli.data.encoded import encode_corpus

# Spec dense bf16 tensor-core peaks (FLOP/s, no sparsity), by a name fragment of the device.
SPEC_BF16_PEAK = {"H100": 989e12, "H200": 989e12, "A100": 312e12}


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


def peak_matmul_size(device: torch.device) -> int:
    """The side of the square matmul timed as the peak: 8192 on CUDA, big enough for the tensor cores."""
    return 8192 if device.type == "cuda" else 2048


def peak_matmul_flops(device: torch.device, dtype: torch.dtype = torch.float32) -> float:
    """FLOP/s of a large square matmul in ``dtype`` on this device: the ceiling MFU is measured against."""
    size, repeats = peak_matmul_size(device), 50 if device.type == "cuda" else 10
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    a @ b
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    if device.type == "cuda":
        torch.cuda.synchronize()
    return 2 * size**3 * repeats / (time.perf_counter() - start)


def emulated_reason(precision: str, native: bool | None, peak: float | None, fp32_peak: float) -> str | None:
    """Why ``precision``'s matmul peak is an emulation's, not a ceiling to measure MFU against;
    None where it is native. ``native``: what the flags or compute capability say
    (``device.computes_natively``); None there: the measurement decides (a native half type
    outruns fp32, an emulated one crawls)."""
    if native is False:
        return f"{precision} is emulated on this device (no native {precision} instructions)"
    if native is None and peak is not None and peak < fp32_peak:
        return (f"{precision} measured {peak / 1e9:.1f} GFLOP/s, below fp32's {fp32_peak / 1e9:.1f}: "
                f"emulated on this device")
    return None


def measured_peaks(device: torch.device) -> tuple[dict[str, float], dict[str, str]]:
    """fp32 and bf16 matmul peaks timed here, and why each emulated one is not a peak. A bf16
    the flags already call emulated is not timed (on an AVX2 CPU 2048^3 x 10 took minutes)."""
    peaks = {"fp32": peak_matmul_flops(device, torch.float32)}
    native = computes_natively("bf16", device)
    if native is not False:
        peaks["bf16"] = peak_matmul_flops(device, torch.bfloat16)
    reason = emulated_reason("bf16", native, peaks.get("bf16"), peaks["fp32"])
    return peaks, ({"bf16": reason} if reason else {})


def mfu_text(achieved: float, peaks: dict[str, float], emulated: dict[str, str]) -> str:
    """MFU against each native precision's peak; none against an emulated one."""
    return ", ".join(f"no {name} MFU ({name} emulated)" if name in emulated else f"{achieved / peak:5.1%} of {name} peak"
                     for name, peak in {**peaks, **{name: 0.0 for name in emulated}}.items())


def flop_counter(model, loss_of, batches):
    """torch's FlopCounterMode over forward + backward of these batches (no update: the
    gradients are dropped after); ``loss_of``: eager, as compiled code hides its products."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        for batch in batches:
            loss_of(batch.src, batch.tgt_in, batch.tgt_out).backward()
    model.zero_grad(set_to_none=True)
    return counter


def step_flops(model, loss_of, batches) -> float:
    """Model FLOPs of forward + backward over these batches, counted by torch's FlopCounterMode."""
    return float(flop_counter(model, loss_of, batches).get_total_flops())


def baseline_loss(model, device: torch.device, precision: str, eps: float):
    """torch.nn.Transformer's forward under autocast and autograd's label-smoothed CE, in the
    shape of the trainer's loss function (packing and the gradient scale are ours alone)."""
    def loss_of(src, tgt_in, tgt_out, *_):
        with autocast(device, precision):
            logits = model(src, tgt_in)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt_out.reshape(-1), ignore_index=PAD_ID,
                               label_smoothing=eps, reduction="sum")
    return loss_of


def matmul_params(model: torch.nn.Module) -> int:
    """N of the conventional MFU: the weights of every matmul, the (tied) output projection
    included, each counted where it is used; embedding lookups are not matmuls."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def spec_bf16_peak(device: torch.device) -> float | None:
    """The device's spec dense bf16 peak in FLOP/s, or None where it is not listed (CPUs)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in SPEC_BF16_PEAK.items() if key in name), None)


def launches_per_step(cfg, tokenizer, step: TrainStep, batch, precision: str) -> tuple[str, int]:
    """('kernels', CUDA kernels of one update of ``step``, the trainer's step timed above, by
    torch.profiler) on CUDA; elsewhere ('aten ops', ops of the trainer's step on the code path
    CUDA takes, counted on fake tensors)."""
    if step.device.type == "cuda":
        from torch.profiler import ProfilerActivity, profile

        step([batch], batch.n_tokens)  # every shape compiled, autotuned
        synchronize(step.device)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step([batch], batch.n_tokens)
            synchronize(step.device)
        kernels = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
        return "kernels", kernels
    # The trainer's choices for a CUDA device: the half-weight cache on bf16 (README's figure).
    half = wants_half_weights(torch.device("cuda"), precision, compiled=False)
    ops = cuda_path_step_ops(lambda: build_model(cfg, tokenizer), [batch], cfg.train, precision, half)
    return "aten ops", ops.total


def trainer_step(model: torch.nn.Module, cfg, device: torch.device, precision: str, compile: bool = False,
                 static_shapes: bool = False, shapes: int = 0) -> TrainStep:
    """The trainer's own update (train/step.py) for ``model``, one rank, at a fixed learning rate
    (the trainer's schedule sets it step by step; at its 0 before that the weights would not move)."""
    step = TrainStep(model, cfg.train, device, precision, Distributed(), static_shapes, shapes, compile=compile)
    for group in step.optimizer.param_groups:
        group["lr"] = 1e-4
    return step


def run_steps(step: TrainStep, batches, device: torch.device) -> float:
    """Seconds per update of ``step``, one batch each, the device's queue drained at both ends."""
    synchronize(device)
    started = time.perf_counter()
    for batch in batches:
        step([batch], batch.n_tokens)
    synchronize(device)
    return (time.perf_counter() - started) / len(batches)


def run(step: TrainStep, batches, device: torch.device) -> float:
    """Target tokens/s of one update of ``step`` per batch."""
    return sum(b.n_tokens for b in batches) / (run_steps(step, batches, device) * len(batches))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


ROOT = Path(__file__).resolve().parents[1]


def xformer_trainer_rate(args, steps: int, every: int, precision: str) -> tuple[float, list[float]]:
    """Steady-state target tokens/s of ``xformer train`` (its metrics.jsonl), start-up excluded."""
    with tempfile.TemporaryDirectory() as run_dir:
        sets = [*args.set, f"run_dir={run_dir}", f"train.max_steps={steps}", f"train.log_every={every}",
                f"train.valid_every={steps * 10}", "data.valid_max_sentences=8", "train.max_minutes=0",
                f"train.precision={precision}", f"train.device={args.device}"]
        subprocess.run([sys.executable, "-m", "xformer_cli", "train", "-c", args.config, "--overwrite", "--quiet",
                        *[x for kv in sets for x in ("--set", kv)]], check=True, cwd=ROOT)
        rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    rates = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r][1:]
    return statistics.median(rates), rates


def onmt_spm_model(vocab_size: int) -> Path:
    """The peer's joint sentencepiece model of ``vocab_size`` pieces, where
    scripts/peers/run_onmt_multi30k.sh writes it (VOCAB_SIZE; one file per size)."""
    return Path(f"/tmp/onmt-m30k/spm/joint-{vocab_size}.model")


# glibc's malloc set from outside as xformer's trainer sets it from inside (device.keep_freed_memory)
KEEP_FREED_MEMORY = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=2147483647"


def onmt_trainer_rate(venv: str, cfg, steps: int, every: int, keep_freed: bool = False,
                      batch_size: int = 0) -> tuple[float, list[float], float]:
    """Steady-state target tokens/s of OpenNMT-py's onmt_train on the same sizes and max_tokens,
    from its "Step N/M; ...; SRC/TGT tok/s" lines; also its mean target tokens per batch.
    ``keep_freed``: under the malloc settings xformer's trainer applies to itself; ``batch_size``:
    its -batch_size in tokens (default: the config's max_tokens, which it counts differently)."""
    m = cfg.model
    env = {**os.environ, "PYTHONWARNINGS": "ignore::FutureWarning", "CUDA_VISIBLE_DEVICES": "",
           "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1", **({"GLIBC_TUNABLES": KEEP_FREED_MEMORY} if keep_freed else {})}
    vocab = str(cfg.tokenizer.vocab_size)  # the same output layer as ours: the config's vocabulary size
    spm_model = onmt_spm_model(cfg.tokenizer.vocab_size)
    if not spm_model.exists():  # the peer script trains it (same recipe as xformer's tokenizer)
        subprocess.run(["bash", "scripts/peers/run_onmt_multi30k.sh", "1"], check=True, cwd=ROOT,
                       env={**env, "VOCAB_SIZE": vocab}, stdout=subprocess.DEVNULL)
    common = ["-config", "scripts/peers/onmt_multi30k.yaml", "-src_subword_model", str(spm_model),
              "-tgt_subword_model", str(spm_model), "-src_vocab_size", vocab, "-tgt_vocab_size", vocab]
    subprocess.run([f"{venv}/bin/onmt_build_vocab", *common, "-n_sample", "-1"], check=True, cwd=ROOT, env=env,
                   capture_output=True)
    sizes = ["-hidden_size", m.d_model, "-word_vec_size", m.d_model, "-transformer_ff", m.d_ff, "-heads", m.n_heads,
             "-enc_layers", m.encoder_layers, "-dec_layers", m.decoder_layers,
             "-batch_size", batch_size or cfg.train.max_tokens,
             "-train_steps", steps, "-report_every", every, "-save_checkpoint_steps", steps * 10,
             "-valid_steps", steps * 10, "-seed", 1]
    done = subprocess.run([f"{venv}/bin/onmt_train", *common, *map(str, sizes)], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    log = done.stdout + done.stderr
    if done.returncode != 0:
        raise SystemExit(f"onmt_train failed:\n{log[-3000:]}")
    steps_found = re.findall(r"Step\s+\d+/\s*\d+;.*?bsz:\s*(\d+)/(\d+)/(\d+);\s*(\d+)/(\d+) tok/s", log)
    rates = [float(tgt_rate) for *_, tgt_rate in steps_found][1:]
    per_batch = statistics.mean(float(tgt) for _, tgt, *_ in steps_found)
    return statistics.median(rates), rates, per_batch


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/multi30k.yaml")
    parser.add_argument("--steps", type=int, default=20, help="batches per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=6000, help="training pairs to tokenize and batch")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides (e.g. paper-base sizes)")
    parser.add_argument("--trainer-steps", type=int, default=0, help="also time whole trainers for this many steps")
    parser.add_argument("--report-every", type=int, default=10, help="steps per tokens/s report in --trainer-steps")
    parser.add_argument("--device", default="cpu", help="cpu, cuda (bf16 autocast), auto")
    parser.add_argument("--compile", action="store_true",
                        help="time xformer's model and loss under torch.compile, as train.compile runs them")
    parser.add_argument("--length-bucket", type=int, default=0,
                        help="batches of declared shapes, as train.length_bucket (with --compile on CUDA: CUDA graphs)")
    parser.add_argument("--onmt-venv", help="OpenNMT-py 3.5.1 virtualenv: time onmt_train too (needs --trainer-steps)")
    parser.add_argument("--onmt-batch-size", type=int, default=0,
                        help="onmt_train's -batch_size (tokens); default the config's max_tokens. OpenNMT-py counts a "
                             "batch's tokens differently: this sets one whose batches hold as many target tokens as ours")
    parser.add_argument("--onmt-keep-freed", action="store_true",
                        help="also time onmt_train with glibc's malloc set as xformer's trainer sets its own")
    return parser.parse_args()


def load_batches(cfg, args, device: torch.device):
    """(tokenizer, batch plan, batches on ``device``): the first --pairs pairs, batched as the trainer does."""
    corpus = load_corpus(cfg.data.train[0], cfg.data.src_lang, cfg.data.tgt_lang, "train")
    corpus.src, corpus.tgt = corpus.src[: args.pairs], corpus.tgt[: args.pairs]
    tokenizer = Tokenizer.train(corpus.src, corpus.tgt, joint=True, vocab_size=cfg.tokenizer.vocab_size)
    data = encode_corpus(corpus, tokenizer, cfg.data.max_len)
    plan = plan_for(data, cfg.train.max_tokens, args.length_bucket, seed=1)  # the trainer's batches
    return tokenizer, plan, [plan.load(idx).to(device) for idx in plan.batches(0, plan.data.src_lens, plan.data.tgt_lens)[: args.steps]]


def trainer_model(cfg, tokenizer, plan):
    """The model ``xformer train`` builds for ``plan``'s corpus: with ``model.restrict_output``,
    an output layer over the pieces its target side uses, counted as a
    fresh run counts them (train/output_pieces.py); else over the whole vocabulary."""
    if not cfg.model.restrict_output:
        return build_model(cfg, tokenizer)
    ids = np.concatenate([np.asarray(line, dtype=np.int64) for line in plan.data.tgt])
    return build_model(cfg, tokenizer, target_pieces(ids, tokenizer.tgt_vocab_size))


def build_systems(cfg, args, tokenizer, plan, device: torch.device, auto: str):
    """[(name, label, the trainer's step, eager loss_of (FLOP count), model)] and xformer's model.
    Ours is the trainer's step: its half-weight cache (CUDA, bf16, eager) and its forward-and-loss
    function, compiled as train.compile compiles it (CUDA graphs with --length-bucket on CUDA).
    One model trains in both precisions (a step each): the weights stay fp32 either way, only the
    autocast differs. The peer's model and loss go through the same step, so only they differ."""
    torch.manual_seed(0)
    ours = trainer_model(cfg, tokenizer, plan).train().to(device)
    m = cfg.model
    theirs = TorchBaseline(tokenizer.src_vocab_size, m.d_model, m.d_ff, m.n_heads, m.encoder_layers,
                           m.decoder_layers, m.dropout).train().to(device)
    eps = cfg.train.label_smoothing
    shapes = 2 * len(plan.declared(cfg.data.max_len))  # each shape in both precisions: one compilation each
    ours_as = {"fp32": ("ours-fp32", "xformer fp32")} | ({} if auto == "fp32" else
                                                          {auto: ("ours-auto", f"xformer auto ({auto})")})
    systems = [(name, label.ljust(22), trainer_step(ours, cfg, device, p, args.compile, plan.static_shapes, shapes),
                forward_loss(ours, device, p, eps), ours) for p, (name, label) in ours_as.items()]
    peer = trainer_step(theirs, cfg, device, "fp32")
    peer.loss_of = baseline_loss(theirs, device, "fp32", eps)
    systems.append(("theirs", "torch.nn.Transformer  ", peer, peer.loss_of, theirs))
    return systems, ours


def time_systems(systems, batches, device: torch.device, rounds: int) -> dict[str, list[float]]:
    """Target tokens/s of each system per round, rounds alternating so machine noise hits them alike."""
    for _, _, step, *_ in systems:
        run(step, batches, device)  # warm-up: every batch shape compiled (and its CUDA graph captured)
    rates: dict[str, list[float]] = {name: [] for name, *_ in systems}
    for _ in range(rounds):
        for name, _, step, *_ in systems:
            rates[name].append(run(step, batches, device))
    return rates


def report_model_loop(systems, rates, batches, device: torch.device) -> None:
    """tokens/s, counted-FLOP MFU against matmuls timed here, and conventional MFU (spec peak)."""
    real = sum(b.n_tokens for b in batches)
    peaks, emulated = measured_peaks(device)
    flops_per_token = {name: step_flops(model, eager, batches) / real for name, _, _, eager, model in systems}
    side = peak_matmul_size(device)
    print(f"peak matmul ({side}^3, same process): "
          + ", ".join(f"{name} {peak / 1e9:.1f} GFLOP/s" for name, peak in peaks.items())
          + "".join(f"; {reason}: no MFU against it" for reason in emulated.values()))
    for name, label, *_ in systems:
        rate = max(rates[name])
        achieved = rate * flops_per_token[name]
        print(f"{label} {rate:8.0f} target tokens/s  {achieved / 1e9:6.1f} GFLOP/s  MFU {mfu_text(achieved, peaks, emulated)}"
              f"  (rounds: {', '.join(f'{r:.0f}' for r in rates[name])};"
              f" {flops_per_token[name] / 1e6:.1f} MFLOP per target token)")
    peak = spec_bf16_peak(device)
    n_matmul = matmul_params(systems[0][4])
    for name, label, *_ in systems[:-1]:
        rate = max(rates[name])
        mfu = f"{6 * n_matmul * rate / peak:5.1%} of the spec bf16 peak" if peak else "n/a (no spec peak for this device)"
        print(f"conventional MFU {label.strip()}: 6 x {n_matmul / 1e6:.1f}M matmul params x {rate:.0f} tokens/s = {mfu}")


def report_trainers(args, cfg, auto: str) -> None:
    """Whole trainers: xformer train in fp32 and auto, and OpenNMT-py's onmt_train with --onmt-venv."""
    print(f"whole trainers, {args.trainer_steps} steps, tokens/s reported every {args.report_every} steps (median, first dropped):")
    trainer_rates = {}
    for precision in dict.fromkeys(["fp32", auto]):
        rate, reports = xformer_trainer_rate(args, args.trainer_steps, args.report_every, precision)
        trainer_rates[precision] = rate
        print(f"xformer train {precision:<6} {rate:8.0f} target tokens/s  (reports: {', '.join(f'{r:.0f}' for r in reports)})")
    if args.onmt_venv:
        onmt_rate, onmt_reports, per_batch = onmt_trainer_rate(args.onmt_venv, cfg, args.trainer_steps, args.report_every,
                                                               batch_size=args.onmt_batch_size)
        print(f"OpenNMT-py onmt_train {onmt_rate:7.0f} target tokens/s  ({per_batch:.0f} target tokens per batch; "
              f"reports: {', '.join(f'{r:.0f}' for r in onmt_reports)})")
        for precision, rate in trainer_rates.items():
            print(f"ratio xformer {precision} / OpenNMT-py: {rate / onmt_rate:.2f}x")
        if args.onmt_keep_freed:
            kept, kept_reports, _ = onmt_trainer_rate(args.onmt_venv, cfg, args.trainer_steps, args.report_every, True,
                                                      args.onmt_batch_size)
            print(f"OpenNMT-py onmt_train, GLIBC_TUNABLES={KEEP_FREED_MEMORY} {kept:7.0f} target tokens/s  "
                  f"(reports: {', '.join(f'{r:.0f}' for r in kept_reports)})")
            for precision, rate in trainer_rates.items():
                print(f"ratio xformer {precision} / OpenNMT-py with those settings: {rate / kept:.2f}x")


def main() -> None:
    args = parse_args()
    cfg = load_config(args.config, args.set)
    if cfg.train.max_tokens == "auto":  # the probe belongs to a training run; a benchmark names its batch
        raise SystemExit("error: bench_train needs a number for train.max_tokens (--set train.max_tokens=N), not auto")
    device = pick_device(args.device)  # on CUDA: TF32 matmuls, no cuDNN attention (device.configure_cuda)
    if device.type == "cpu":
        keep_freed_memory()  # as the trainer runs (train/run_plan.py); the loops share one process
    tokenizer, plan, batches = load_batches(cfg, args, device)
    auto, why = resolve_precision("auto", device)
    systems, ours = build_systems(cfg, args, tokenizer, plan, device, auto)
    before = compilations()
    rates = time_systems(systems, batches, device, args.rounds)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{cpu_name()}, {torch.get_num_threads()} threads"
    print(f"machine: {where}, torch {torch.__version__}")
    if device.type == "cpu":
        flags = sorted(f for f in cpu_flags() if f.startswith(("avx512", "amx", "avx_vnni", "avx2", "fma")))
        print(f"cpu flags: {' '.join(flags)}")
    shapes = len({(*b.src.shape, b.tgt_in.size(1)) for b in batches})
    print(f"precision auto -> {auto} ({why})"
          + (f"; model and loss under torch.compile (mode {compile_mode(device, plan.static_shapes)[0] or 'default'}): "
             f"{compilations() - before} compilations for {shapes} batch shapes x {len(systems) - 1} precisions"
             if args.compile else ""))
    real = sum(b.n_tokens for b in batches)
    print(f"config: {args.config}  params: {ours.count_parameters():,}  batches: {len(batches)} x max_tokens {cfg.train.max_tokens}"
          f"  ({real / len(batches):.0f} target tokens per batch)")
    report_model_loop(systems, rates, batches, device)
    auto_step = systems[-2][2]  # ours in the precision auto picks
    kind, launches = launches_per_step(cfg, tokenizer, auto_step, batches[0], auto)
    print(f"{kind} per training step ({auto}, one batch of {batches[0].n_tokens} target tokens, fused Adam): {launches}")
    for name, label, *_ in systems[:-1]:
        print(f"ratio {label.strip()} / torch.nn.Transformer: {max(rates[name]) / max(rates['theirs']):.2f}x")
    if args.trainer_steps:
        report_trainers(args, cfg, auto)

if __name__ == "__main__":
    main()
