"""The options the commands that translate share (translate, eval-bleu, serve): one definition,
one help text."""

from __future__ import annotations

import typer

BEAM_SIZE = typer.Option(None, "--beam-size", "-b", help="1 = greedy; default from the checkpoint's decode config.")
LENGTH_PENALTY = typer.Option(None, "--length-penalty", help="GNMT length penalty alpha (paper: 0.6).")
MAX_LEN_A = typer.Option(None, "--max-len-a", help="Max output length = a * source length + b.")
MAX_LEN_B = typer.Option(None, "--max-len-b", help="Max output length = a * source length + b.")
MIN_LEN = typer.Option(None, "--min-len", help="Output pieces before eos at least (default 1: no empty translations).")
BATCH_SIZE = typer.Option(None, "--batch-size", help="Sentences per decoding batch.")
DEVICE = typer.Option("auto", "--device",
                      help="auto (CUDA when the engine sees a GPU, else the CPU), cpu, cuda or cuda:N.")
ENGINE = typer.Option("auto", "--engine",
                      help="auto (--precision decides), xformer (PyTorch), or ctranslate2 "
                           "(an export directory, or a checkpoint exported at start).")
PRECISION = typer.Option("auto", "--precision",
                         help="auto (the fastest whose BLEU stays within 0.2 of fp32; stderr says "
                              "which), fp32, bf16, fp16, int8 or another CTranslate2 compute type.")
THREADS = typer.Option(0, "--threads",
                       help="CPU threads; 0 = $OMP_NUM_THREADS if set, else every core.")
COMPUTE_TYPE = typer.Option(None, "--compute-type", hidden=True,
                            help="Deprecated: --precision takes CTranslate2's compute types.")
TARGET_LANG = typer.Option(None, "--target-lang", "-t",
                           help="Target language (fr, or fra): needed for a multilingual model with several.")
SOURCE_LANG = typer.Option(None, "--source-lang",
                           help="Source language (default: the one the model "
                                "translates into the target from, else detected).")
