#!/usr/bin/env bash
# Train the OpenNMT-py 3.5.1 peer on Multi30k en->de on the CPU, then translate the first
# 100 lines of valid.en with beam 5.
#
#   scripts/peers/setup_opennmt.sh                 # once
#   scripts/peers/run_onmt_multi30k.sh [STEPS]     # STEPS defaults to 50
#
# Environment (all optional):
#   VENV          OpenNMT-py virtual environment            (default /tmp/onmt-venv)
#   VOCAB_SIZE    pieces of the sentencepiece model and of OpenNMT-py's vocabulary (default 8000:
#                 configs/multi30k.yaml's tokenizer.vocab_size; passed over the yaml's own)
#   SPM_MODEL     joint sentencepiece .model for en and de  (default
#                 /tmp/onmt-m30k/spm/joint-$VOCAB_SIZE.model, trained here if missing: unigram,
#                 pad=0 unk=1 bos=2 eos=3, on train.en + train.de, like xformer's tokenizer)
#   REPORT_EVERY  steps between OpenNMT-py's tok/s log lines (default 5 below 250 steps, else 25)
#
# Outputs in /tmp/onmt-m30k (the paths in onmt_multi30k.yaml): vocab.shared,
# model_step_STEPS.pt, train_STEPSsteps.log (onmt_train's console log, with the tok/s lines),
# valid100.en, valid100.hyp.de, translate.log.
#
# The tok/s in lines like "Step 10/50; acc: ...; 1234/1456 tok/s; 20 sec;" are
# SOURCE/TARGET tokens per second of wall-clock time since the previous report
# (onmt/utils/statistics.py Statistics.output): source = sum of the batches' source
# lengths (sentencepiece pieces), target = non-padding target tokens scored by the loss
# (pieces + </s>, no <s>). The window includes data loading, tokenization, forward,
# backward and the optimizer step. "N sec" is time since training started.
set -euo pipefail

STEPS="${1:-50}"
VENV="${VENV:-/tmp/onmt-venv}"
WORK=/tmp/onmt-m30k                      # matches the /tmp paths in onmt_multi30k.yaml
VOCAB_SIZE="${VOCAB_SIZE:-8000}"
SPM_MODEL="${SPM_MODEL:-$WORK/spm/joint-$VOCAB_SIZE.model}"
if [[ -z "${REPORT_EVERY:-}" ]]; then
  if (( STEPS < 250 )); then REPORT_EVERY=5; else REPORT_EVERY=25; fi
fi

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"                               # the config's data paths are relative to the repo root
CFG=scripts/peers/onmt_multi30k.yaml
DATA=../shared/data/multi30k
PY="$VENV/bin/python"
export PYTHONWARNINGS="ignore::FutureWarning"   # torch 2.13: torch.cuda.amp.custom_fwd deprecation
export CUDA_VISIBLE_DEVICES=""                  # CPU only
# Shim for torch >= 2.6 (torch.load defaults to weights_only=True): OpenNMT-py 3.5.1 calls
# torch.load(ckpt_path, map_location=...) without weights_only (onmt/models/model_saver.py:33,
# load_checkpoint), and its checkpoints pickle an argparse.Namespace, so onmt_translate
# (and -train_from) fail with "_pickle.UnpicklingError: Weights only load failed ...
# Unsupported global: GLOBAL argparse.Namespace". This torch variable restores
# weights_only=False where the caller did not pass it. Only for checkpoints you made.
export TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1

[[ -x "$VENV/bin/onmt_train" ]] || { echo "no OpenNMT-py in $VENV: run scripts/peers/setup_opennmt.sh $VENV" >&2; exit 1; }
mkdir -p "$WORK"

# 1. tokenizer (only if missing)
if [[ ! -f "$SPM_MODEL" ]]; then
  echo "== training sentencepiece model -> $SPM_MODEL"
  mkdir -p "$(dirname "$SPM_MODEL")"
  "$PY" - "$DATA/train.en" "$DATA/train.de" "$SPM_MODEL" "$VOCAB_SIZE" <<'EOF'
import sys, sentencepiece as spm
src, tgt, out, vocab_size = sys.argv[1:]
spm.SentencePieceTrainer.train(
    input=f"{src},{tgt}", model_prefix=out[: -len(".model")] if out.endswith(".model") else out,
    vocab_size=int(vocab_size), model_type="unigram", character_coverage=1.0,
    pad_id=0, unk_id=1, bos_id=2, eos_id=3, pad_piece="<pad>",
    hard_vocab_limit=False, num_threads=2, minloglevel=2)
EOF
fi
SPM_ARGS=(-src_subword_model "$SPM_MODEL" -tgt_subword_model "$SPM_MODEL")
VOCAB_ARGS=(-src_vocab_size "$VOCAB_SIZE" -tgt_vocab_size "$VOCAB_SIZE")  # build_vocab and train (translate refuses them)

# 2. vocabulary
echo "== onmt_build_vocab"
"$VENV/bin/onmt_build_vocab" -config "$CFG" "${SPM_ARGS[@]}" "${VOCAB_ARGS[@]}" -n_sample -1

# 3. training
LOG="$WORK/train_${STEPS}steps.log"
rm -f "$LOG" "$WORK/model_step_${STEPS}.pt"
echo "== onmt_train: $STEPS steps, report every $REPORT_EVERY, log $LOG"
start=$(date +%s)
# The log is the console output (tee): see the note on log_file in $CFG.
"$VENV/bin/onmt_train" -config "$CFG" "${SPM_ARGS[@]}" "${VOCAB_ARGS[@]}" \
  -train_steps "$STEPS" -report_every "$REPORT_EVERY" 2>&1 | tee "$LOG"
echo "== training wall clock (process, incl. start-up): $(( $(date +%s) - start )) s"
grep "tok/s" "$LOG" || true

# 4. translate the first 100 lines of valid.en, beam 5. onmt_translate does not take the
#    transforms from the checkpoint: without -transforms it would split the source on
#    spaces (whole words, mostly <unk>); with it, it encodes the source and decodes the
#    output pieces back to text.
CKPT="$WORK/model_step_${STEPS}.pt"
[[ -f "$CKPT" ]] || { echo "onmt_train wrote no $CKPT (see $LOG)" >&2; exit 1; }
head -n 100 "$DATA/valid.en" > "$WORK/valid100.en"
head -n 100 "$DATA/valid.de" > "$WORK/valid100.de"
echo "== onmt_translate $CKPT (beam 5)"
start=$(date +%s)
"$VENV/bin/onmt_translate" -model "$CKPT" -src "$WORK/valid100.en" -output "$WORK/valid100.hyp.de" \
  -transforms sentencepiece "${SPM_ARGS[@]}" \
  -beam_size 5 -batch_size 64 -batch_type sents -gpu -1 -report_time -log_file "$WORK/translate.log"
echo "== translation wall clock (process, incl. start-up): $(( $(date +%s) - start )) s"
echo "non-empty hypotheses: $(grep -c . "$WORK/valid100.hyp.de" || true)/100; first 3:"
head -n 3 "$WORK/valid100.hyp.de"
"$VENV/bin/sacrebleu" "$WORK/valid100.de" -i "$WORK/valid100.hyp.de" -m bleu -b -w 2 \
  | sed 's/^/BLEU (100 valid lines): /'
