"""Decoding speed: xformer without and with its key/value cache, in fp32 and bf16, the same
model exported to CTranslate2 (float32 and int8: ``xformer translate --precision int8`` is
that int8 engine), and OpenNMT-py's onmt_translate on a model of the same size, in one run.

For each beam size it prints sentences/s and target tokens/s (output sentencepiece pieces
+ eos, counted with the xformer model's tokenizer for every system) and BLEU against the
reference, so speed is never bought with worse output.

    python scripts/bench_decode.py --checkpoint runs/multi30k/best.pt
    python scripts/bench_decode.py --checkpoint runs/multi30k/best.pt --beams 1 5 \\
        --onmt-venv /tmp/onmt-venv --onmt-model /tmp/onmt-m30k/model_step_300.pt

The OpenNMT-py model comes from scripts/peers/run_onmt_multi30k.sh (same sizes as
configs/multi30k.yaml); its time is its own "Total translation time" (start-up excluded).

Every measurement runs in a process of its own (model load and a warm-up excluded from
the time): CTranslate2's thread pool, once used, slows PyTorch in the same process by
about 30% for the rest of its life, which an earlier single-process version of this
script charged to whichever xformer run came after it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import sacrebleu
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from bench_train import cpu_name, onmt_spm_model  # noqa: E402

from xformer_cli.decode.factory import choose_engine  # noqa: E402
from xformer_cli.decode.translator import Translator  # noqa: E402
from xformer_cli.device import cpu_flags  # noqa: E402

DATA = Path(os.environ.get("XFORMER_DATA", ROOT.parent / "shared" / "data"))


def timed(fn) -> tuple[list[str], float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def onmt_translate(venv: str, model: str, spm: Path, src: Path, beam: int, threads: int,
                   batch_size: int) -> tuple[list[str], float]:
    """onmt_translate's output and its own translation time (start-up and model load excluded);
    ``spm``: the sentencepiece model the peer was trained with."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore::FutureWarning", "CUDA_VISIBLE_DEVICES": "",
           "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1", "OMP_NUM_THREADS": str(threads)}
    if not spm.is_file():
        raise SystemExit(f"no {spm}: train the peer of that size with scripts/peers/run_onmt_multi30k.sh (VOCAB_SIZE)")
    with tempfile.TemporaryDirectory() as tmp:
        hyp = Path(tmp) / "hyp"
        done = subprocess.run(
            [f"{venv}/bin/onmt_translate", "-model", model, "-src", str(src), "-output", str(hyp),
             "-transforms", "sentencepiece", "-src_subword_model", spm, "-tgt_subword_model", spm,
             "-beam_size", str(beam), "-batch_size", str(batch_size), "-batch_type", "sents", "-gpu", "-1", "-report_time",
             "-max_length", "250"],
            cwd=ROOT, env=env, capture_output=True, text=True)
        log = done.stdout + done.stderr
        if done.returncode != 0:
            raise SystemExit(f"onmt_translate failed:\n{log[-3000:]}")
        seconds = float(re.search(r"Total translation time \(s\):\s*([\d.]+)", log).group(1))
        return hyp.read_text(encoding="utf-8").splitlines(), seconds


def measure(args: argparse.Namespace) -> None:
    """Worker: one system at one beam size; prints seconds and writes the hypotheses."""
    torch.set_num_threads(args.threads)
    src_lines = Path(args.src).read_text(encoding="utf-8").splitlines()
    if args.sentences:
        src_lines = src_lines[: args.sentences]
    beam = args.beams[0]
    options = {"beam_size": beam, "batch_size": args.batch_size, "max_tokens": args.max_tokens}
    if args.worker.startswith("ct2"):
        from xformer_cli.decode.ct2_engine import CTranslate2Translator

        engine = CTranslate2Translator.from_directory(args.ct2_dir, device="cuda" if args.device.startswith("cuda") else "cpu",
                                                      threads=args.threads, compute_type="int8" if args.worker == "ct2-int8" else "default")
    else:
        engine = Translator.from_checkpoint(args.checkpoint, device=args.device,
                                            precision="bf16" if args.worker == "cached-bf16" else "fp32")
        options["use_cache"] = args.worker != "uncached"
    engine.translate(src_lines[:20], beam_size=beam)  # warm-up
    hyps, seconds = timed(lambda: engine.translate(src_lines, **options))
    Path(args.hyp_out).write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    print(json.dumps({"seconds": seconds}))


def in_own_process(args: argparse.Namespace, worker: str, beam: int, hyp_file: Path) -> tuple[list[str], float]:
    command = [sys.executable, __file__, "--worker", worker, "--beams", str(beam), "--hyp-out", str(hyp_file),
               "--checkpoint", args.checkpoint, "--src", args.src, "--sentences", str(args.sentences),
               "--threads", str(args.threads), "--device", args.device,
               "--batch-size", str(args.batch_size), "--max-tokens", str(args.max_tokens)]
    if args.ct2_dir:
        command += ["--ct2-dir", str(args.ct2_dir)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{worker} beam {beam} failed:\n{done.stderr[-3000:]}")
    seconds = json.loads(done.stdout.strip().splitlines()[-1])["seconds"]
    return hyp_file.read_text(encoding="utf-8").splitlines(), seconds


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--src", default=str(DATA / "multi30k" / "test2016.en"))
    parser.add_argument("--ref", default=str(DATA / "multi30k" / "test2016.de"))
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--sentences", type=int, default=0, help="only the first N (0 = all)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=64, help="sentences per batch, for every system")
    parser.add_argument("--max-tokens", type=int, default=16000, help="xformer and CTranslate2: padded source tokens x beam per batch")
    parser.add_argument("--no-uncached", action="store_true", help="skip (a), the slow no-cache reference")
    parser.add_argument("--ct2-dir", help="exported model (default: export to a temporary directory)")
    parser.add_argument("--onmt-venv")
    parser.add_argument("--onmt-model")
    parser.add_argument("--no-bf16", action="store_true", help="skip xformer bf16")
    parser.add_argument("--no-int8", action="store_true", help="skip CTranslate2 int8 (= xformer --precision int8)")
    parser.add_argument("--worker", choices=["uncached", "cached", "cached-bf16", "ct2", "ct2-int8"], help=argparse.SUPPRESS)
    parser.add_argument("--hyp-out", help=argparse.SUPPRESS)
    return parser.parse_args()


def workers_of(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(worker, name) of every system measured in its own process."""
    workers = ([] if args.no_uncached else [("uncached", "(a) xformer, no cache")]) + [("cached", "(b) xformer fp32")]
    if not args.no_bf16:
        workers.append(("cached-bf16", "(b) xformer bf16"))
    if args.ct2_dir:
        workers.append(("ct2", "(c) CTranslate2 float32"))
        if not args.no_int8:
            workers.append(("ct2-int8", "(c) CT2 int8 = xf int8"))
    return workers


def main() -> None:
    args = parse_args()
    if args.worker:
        return measure(args)

    src_lines = Path(args.src).read_text(encoding="utf-8").splitlines()
    ref_lines = Path(args.ref).read_text(encoding="utf-8").splitlines()
    if args.sentences:
        src_lines, ref_lines = src_lines[: args.sentences], ref_lines[: args.sentences]
    translator = Translator.from_checkpoint(args.checkpoint, device="cpu")  # for counting tokens

    def target_tokens(lines: list[str]) -> int:
        return sum(len(ids) + 1 for ids in translator.tokenizer.encode_tgt(lines))

    systems = []
    with tempfile.TemporaryDirectory() as tmp:
        if importlib.util.find_spec("ctranslate2") is None:
            print("(CTranslate2 not measured: the ctranslate2 package is not installed)")
        else:
            from xformer_cli.export.ctranslate2 import export_ctranslate2

            args.ct2_dir = args.ct2_dir or export_ctranslate2(args.checkpoint, Path(tmp) / "ct2")
        for beam in args.beams:
            for worker, name in workers_of(args):
                systems.append((beam, name, *in_own_process(args, worker, beam, Path(tmp) / f"{worker}{beam}.hyp")))
            if args.onmt_venv and args.onmt_model:
                src_file = Path(tmp) / "src.txt"
                src_file.write_text("".join(line + "\n" for line in src_lines), encoding="utf-8")
                spm = onmt_spm_model(translator.tokenizer.src_vocab_size)  # the peer of the same size as ours
                systems.append((beam, "(d) OpenNMT-py 3.5.1", *onmt_translate(args.onmt_venv, args.onmt_model, spm, src_file, beam,
                                                                            args.threads, args.batch_size)))

    print(f"machine: {cpu_name()}, {args.threads} threads, torch {torch.__version__}, device {args.device}")
    flags = sorted(f for f in cpu_flags() if f.startswith(("avx512_bf16", "avx512_vnni", "amx", "avx_vnni", "avx2")))
    auto = choose_engine([Path(args.checkpoint)], device=args.device)
    print(f"cpu flags: {' '.join(flags)}; translate --precision auto -> {auto.engine} {auto.precision} ({auto.why})")
    print(f"model: {args.checkpoint} ({translator.model.count_parameters():,} parameters); "
          f"{len(src_lines)} sentences of {args.src}; length penalty {translator.decode.length_penalty}; "
          f"batches of {args.batch_size} sentences (xformer, CTranslate2: and {args.max_tokens} tokens x beam)")
    print(f"{'beam':>4}  {'system':<24} {'seconds':>8} {'sent/s':>8} {'tgt tok/s':>10} {'BLEU':>6}")
    reference = {("xformer", "bf16"): "(b) xformer bf16", ("ctranslate2", "int8"): "(c) CT2 int8 = xf int8",
                 ("ctranslate2", "float32"): "(c) CTranslate2 float32"}.get((auto.engine, auto.precision), "(b) xformer fp32")
    if not any(name == reference for _, name, _, _ in systems):
        reference = "(b) xformer fp32"
    baseline: dict[int, tuple[float, list[str]]] = {}
    for beam, name, hyps, seconds in systems:
        score = sacrebleu.corpus_bleu(hyps, [ref_lines]).score
        rate = target_tokens(hyps) / seconds
        if name == reference:
            baseline[beam] = (rate, hyps)
        print(f"{beam:>4}  {name:<24} {seconds:8.2f} {len(src_lines) / seconds:8.1f} {rate:10.0f} {score:6.2f}")
    for beam, name, hyps, seconds in systems:
        if beam in baseline and name != reference:
            rate, ours = baseline[beam]
            same = sum(a == b for a, b in zip(hyps, ours))
            print(f"beam {beam}: {reference[4:]} (auto) is {rate / (target_tokens(hyps) / seconds):.2f}x {name[4:]} in target tokens/s; "
                  f"identical outputs {same}/{len(ours)}")


if __name__ == "__main__":
    main()
