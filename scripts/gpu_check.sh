#!/usr/bin/env bash
# One command for the day a GPU is lent: everything only a GPU runs, in about 15 minutes on
# one H100, with one summary file at the end.
#
#   scripts/gpu_check.sh [OUT_DIR]          # OUT_DIR defaults to runs/gpu_check
#   GPU_CHECK_DEVICE=cpu GPU_CHECK_QUICK=1 scripts/gpu_check.sh /tmp/gc   # the same steps, tiny, on a CPU
#   GPU_CHECK_ONLY="train_bf16 bench_train_base" scripts/gpu_check.sh     # only the steps named
#   GPU_CHECK_PART=1 scripts/gpu_check.sh; GPU_CHECK_PART=2 ...; ... GPU_CHECK_PART=10  # the whole check in
#                                           # device calls of under 10 minutes each (a call's limit; part 9: two)
#
# Steps (each one's full output goes to OUT_DIR/<step>.log, its result into OUT_DIR/summary.txt):
#   1. environment: GPU name, torch, CUDA, bf16 support
#   2. the test suite on this machine (the CPU paths stay covered), then the CUDA paths of the
#      trainer: bf16, fp16 with the gradient scaler, torch.compile, pinned prefetch, each a few
#      steps of a tiny model
#   2a. (part 5) data-parallel training for real on the one GPU: two ranks sharing it over gloo
#      with CUDA tensors (the gradient sum, sharded validation), compared with one process
#      accumulating the same two batches (scripts/compare_runs.py); then fp16 with the loss
#      scaler against bf16 on the same GPU, the same steps. What it cannot show: NCCL between
#      two devices (one GPU here; NCCL refuses two ranks on one device)
#   3. bench_train at the paper's base and big sizes (issue 20): tokens/s, MFU against the bf16
#      peak and conventional MFU (spec peak), kernels per step; base at 8k tokens (bf16 vs
#      fp32/TF32), base at 25k tokens, base compiled vs eager at 8k on the same bucketed
#      batches (train.length_bucket 8; compiled = CUDA graphs), big at the shipped big
#      config's batch (3125 tokens); then configs/multi30k-gpu.yaml trained and scored on
#      test2016 (beam 4), where that config exists
#   4. a short real training of configs/wmt-news.yaml (newstest2013 valid), then newstest2014 BLEU
#   5. bench_decode on that checkpoint (fp32 and bf16, CTranslate2 if installed)
#   6. (part 6) the standing throughput targets and where the step goes: the trainer's own step
#      profiled at the paper's base and big sizes at 25k tokens, TF32 and bf16 (GPU busy share of
#      the step, kernel time by kind, kernels per step: scripts/profile_train_step.py); then the
#      whole trainer at 25k tokens, packed batches (one shape): base eager and compiled (CUDA
#      graphs), big eager; median target tokens/s and the log windows a save or validation held
#   7. (part 7) bf16 against TF32 (`train.precision=fp32`) in the whole trainer, base and big, eager,
#      in one call: the standing target bf16 >= 1.2x TF32
#   8. (part 8) issue 27's transfer to a small pair: en->cs on 3,000 pairs, the bilingual baseline
#      (dropout 0.3) and two multilingual models side by side on the GPU for the same minutes
#      (scripts/bench_multilingual_quality.sh, -gpu runs); each run stops with every thread's
#      stack on stderr (faulthandler, SIGABRT) if it outlives its time (the fifth lease's
#      multilingual runs never got past their tokenizer)
#   9. (part 9) configs/multi30k-pipeline-gpu.yaml, every stage (~19 minutes, more than a 15-minute lease: two calls on one warm
#      machine, the second resuming), teacher and student scored on test2016 on the GPU
#   10. (part 10) its first half: a reverse model, its back-translation, then the tagged teacher beside
#      configs/multi30k-gpu.yaml on the same GPU for the same minutes, both scored (issue 49's +1.5); then
#      the teacher's translation profiled (scripts/profile_decode.py: GPU busy share, kernels, host ops)
#      (GPU_CHECK_SYNTHETIC_UNTIL=0.75: the teacher ends on the real pairs alone, teacher.synthetic_until;
#      GPU_CHECK_REAL_TARGETS=true: the real pairs' targets back-translated too, backtranslate.real_targets)
# A failing step is recorded and the next one still runs; the exit code is the number of failures.
set -uo pipefail

cd "$(dirname "$0")/.."
# The lent machine's image has python3 alone and no installed xformer (run it there with
# PYTHONPATH=$PWD): the steps' `python` and `xformer` fall back to these.
command -v python > /dev/null || python() { python3 "$@"; }
command -v xformer > /dev/null || xformer() { python -m xformer_cli "$@"; }
OUT="${1:-runs/gpu_check}"
DEVICE="${GPU_CHECK_DEVICE:-cuda}"
QUICK="${GPU_CHECK_QUICK:-0}"
ONLY="${GPU_CHECK_ONLY:-}"  # space-separated step names; empty = every step (a lease split into calls)
case "${GPU_CHECK_PART:-}" in  # each part fits one device call (10 minutes) on an H100
  1) ONLY="tests train_bf16 train_fp16 train_compile train_compile_buckets train_max_tokens_auto bench_train_base bench_train_base_25k bench_train_big bench_train_base_bucketed bench_train_base_compiled" ;;
  2) ONLY="train_wmt_news bleu_newstest2014 bench_decode" ;;
  3) ONLY="multi30k_gpu bleu_multi30k_gpu" ;;  # ~5 minutes: the 4.5-minute run, averaging, tuning, test2016
  4) ONLY="batching_dynamic batching_packed batching_packed_compiled" ;;  # ~6 minutes: packed vs dynamic batches
  5) ONLY="ddp_single_accumulating ddp_two_ranks_one_gpu ddp_compare precision_bf16 precision_fp16" ;;  # ~5 minutes
  6) ONLY="profile_base_25k profile_big_25k trainer_base_25k_packed trainer_base_25k_packed_compiled trainer_big_25k_packed" ;;  # ~7 minutes
  7) ONLY="trainer_base_25k_packed trainer_base_25k_packed_tf32 trainer_big_25k_packed trainer_big_25k_packed_tf32" ;;  # ~6 minutes: bf16 against TF32, the whole trainer
  8) ONLY="transfer" ;;  # ~6 minutes: three runs side by side, $GPU_CHECK_TRANSFER_MINUTES (3) of training each
  9) ONLY="pipeline_gpu" ;;  # configs/multi30k-pipeline-gpu.yaml: ~19 minutes as shipped, so two calls on one warm
                             # machine (the second resumes), or $GPU_CHECK_PIPELINE_SETS's shorter models in one
  10) ONLY="bt_teacher profile_decode" ;;  # ~9 minutes: the GPU pipeline's teacher question alone (below), and
                                          # where its translation time goes
esac
MINUTES="${GPU_CHECK_MINUTES:-}"
DATA="${XFORMER_DATA:-../shared/data}"
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
FAILED=0

note() { echo "$*" | tee -a "$SUMMARY"; }
step() {  # step NAME COMMAND...: run, log, and record pass/fail with the wall time
  local name="$1"; shift
  if [[ -n "$ONLY" && " $ONLY " != *" $name "* ]]; then return 0; fi
  local started=$SECONDS
  echo "== $name" >&2
  if "$@" > "$OUT/$name.log" 2>&1; then
    note "PASS $name ($((SECONDS - started)) s)"
  else
    note "FAIL $name ($((SECONDS - started)) s): see $OUT/$name.log"
    FAILED=$((FAILED + 1))
  fi
}

if [[ "$QUICK" == 1 ]]; then  # tiny sizes: a rehearsal of the script itself
  STEPS=4; MINUTES=${MINUTES:-0.3}; SIZES_BASE=(model.d_model=64 model.d_ff=128 model.n_heads=4 model.encoder_layers=1 model.decoder_layers=1)
  SIZES_BIG=("${SIZES_BASE[@]}"); SIZES_BASE_25K=("${SIZES_BASE[@]}" train.max_tokens=1500); BENCH_STEPS=2; TEST_ARGS=(-q -x -m "not slow" tests/test_precision.py)
  SENTENCES=50
  # The WMT steps at tiny sizes too: a small model, 50 validation lines, 50 test lines.
  WMT_SETS=(--set model.d_model=64 --set model.d_ff=128 --set model.n_heads=4 --set model.encoder_layers=1
            --set model.decoder_layers=1 --set tokenizer.vocab_size=2000 --set data.valid_max_sentences=50)
  TEST_LINES=50
else
  STEPS=20; MINUTES=${MINUTES:-6}; BENCH_STEPS=15; TEST_ARGS=(-q); SENTENCES=0; WMT_SETS=(); TEST_LINES=0
  SIZES_BASE=(model.d_model=512 model.d_ff=2048 model.n_heads=8 model.encoder_layers=6 model.decoder_layers=6 tokenizer.vocab_size=8000 train.max_tokens=8000)
  SIZES_BASE_25K=("${SIZES_BASE[@]}" train.max_tokens=25000)
  # The shipped big config's batch (configs/wmt14-en-de-big.yaml: 3125 tokens x update_freq 8).
  SIZES_BIG=(model.d_model=1024 model.d_ff=4096 model.n_heads=16 model.encoder_layers=6 model.decoder_layers=6 model.dropout=0.3 tokenizer.vocab_size=8000 train.max_tokens=3125)
fi
M30K_GPU_SETS=(); [[ "$QUICK" == 1 ]] && M30K_GPU_SETS=("${WMT_SETS[@]}" --set train.max_steps=4 --set data.valid_max_sentences=20)
# GPU_CHECK_M30K_MINUTES: train configs/multi30k-gpu.yaml for these minutes in place of its own (the
# target allows 10 in all; the config trains 5)
[[ -n "${GPU_CHECK_M30K_MINUTES:-}" ]] && M30K_GPU_SETS+=(--set "train.max_minutes=$GPU_CHECK_M30K_MINUTES")
# GPU_CHECK_M30K_SETS: more KEY=VALUE overrides for that run, space-separated (model.restrict_output=true)
for kv in ${GPU_CHECK_M30K_SETS:-}; do M30K_GPU_SETS+=(--set "$kv"); done

note "gpu_check $(date -u +%Y-%m-%dT%H:%MZ) device=$DEVICE quick=$QUICK commit=$(git rev-parse --short HEAD 2>/dev/null)"
python - <<EOF | tee -a "$SUMMARY"
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("gpu", torch.cuda.get_device_name(0), "bf16", torch.cuda.is_bf16_supported(),
          f"{torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB")
EOF

# 2. tests, then the trainer's GPU-only paths on a tiny model
step tests python -m pytest "${TEST_ARGS[@]}"
TINY=(--set "data.train.prefix=$DATA/multi30k/train" --set "data.valid.prefix=$DATA/multi30k/valid"
      --set data.valid_max_sentences=50 --set tokenizer.vocab_size=2000 --set model.d_model=64 --set model.d_ff=128
      --set model.encoder_layers=1 --set model.decoder_layers=1 --set "train.max_steps=$STEPS" --set train.valid_every=1000
      --set train.max_minutes=0 --set "train.device=$DEVICE" --set train.log_every=2)
for variant in bf16 fp16; do
  step "train_$variant" xformer train -c configs/multi30k.yaml --quiet --overwrite "${TINY[@]}" \
    --set "run_dir=$OUT/tiny_$variant" --set "train.precision=$variant"
done
step train_compile xformer train -c configs/multi30k.yaml --quiet --overwrite "${TINY[@]}" \
  --set "run_dir=$OUT/tiny_compile" --set train.compile=true
# The trainer's compiled step on declared shapes: mode reduce-overhead (CUDA graphs) on CUDA.
step train_compile_buckets xformer train -c configs/multi30k.yaml --quiet --overwrite "${TINY[@]}" \
  --set "run_dir=$OUT/tiny_compile_buckets" --set train.compile=true --set train.length_bucket=8
grep -h '"compilations"' "$OUT/tiny_compile/metrics.jsonl" "$OUT/tiny_compile_buckets/metrics.jsonl" 2>/dev/null \
  | tail -n 1 | sed 's/^/compiled tiny run, last metrics line: /' >> "$SUMMARY"
# train.max_tokens: auto probes GPU memory once (the resolved value lands in config.yaml).
step train_max_tokens_auto xformer train -c configs/multi30k.yaml --overwrite "${TINY[@]}" \
  --set "run_dir=$OUT/tiny_auto" --set train.max_tokens=auto --set train.tokens_per_update=25000 --set train.length_bucket=8
grep -hE "max_tokens: auto|tokens_per_update" "$OUT/train_max_tokens_auto.log" >> "$SUMMARY" 2>/dev/null
# 2a. two ranks on the one GPU (gloo over CUDA tensors) against one process accumulating two batches
DDP_SETS=("${TINY[@]}" --set model.dropout=0.0 --set train.log_every=1 --set "train.max_steps=$STEPS")
step ddp_single_accumulating xformer train -c configs/multi30k.yaml --quiet --overwrite "${DDP_SETS[@]}" \
  --set "run_dir=$OUT/ddp_single" --set train.update_freq=2
step ddp_two_ranks_one_gpu torchrun --standalone --nproc_per_node 2 -m xformer_cli train -c configs/multi30k.yaml --quiet \
  --overwrite "${DDP_SETS[@]}" --set "run_dir=$OUT/ddp_two" --set train.update_freq=1 --set train.dist_backend=gloo
step ddp_compare python scripts/compare_runs.py "$OUT/ddp_single" "$OUT/ddp_two"
grep -hE "^(steps|weights|losses|agree|DIFFER)" "$OUT/ddp_compare.log" 2>/dev/null | sed 's/^/ddp: /' >> "$SUMMARY"
# fp16 with the loss scaler against bf16: the same steps of the GPU config, tokens/s and valid loss
PRECISION_STEPS=$([[ "$QUICK" == 1 ]] && echo 4 || echo 600)
for variant in bf16 fp16; do
  step "precision_$variant" xformer train -c configs/multi30k-gpu.yaml --quiet --overwrite "${M30K_GPU_SETS[@]}" \
    --set "run_dir=$OUT/precision_$variant" --set "train.device=$DEVICE" --set "train.precision=$variant" \
    --set "train.max_steps=$PRECISION_STEPS" --set train.max_minutes=0 --set train.tune_length_penalty=[] \
    --set train.average_last=0
  python - "$OUT/precision_$variant/metrics.jsonl" "$variant" >> "$SUMMARY" 2>/dev/null <<'PY'
import json, statistics, sys
rows = list(map(json.loads, open(sys.argv[1])))
rates = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r][1:] or [0]
valid = [r for r in rows if "valid_loss" in r]
print(f"precision {sys.argv[2]}: median {statistics.median(rates):.0f} target tokens/s; last valid loss "
      f"{valid[-1]['valid_loss'] if valid else '-'} BLEU {valid[-1]['valid_bleu'] if valid else '-'}")
PY
done

# 3. training throughput at the paper's sizes (MFU against the bf16 matmul peak in the same process)
SETS_BASE=(); for kv in "${SIZES_BASE[@]}"; do SETS_BASE+=("$kv"); done
SETS_BIG=(); for kv in "${SIZES_BIG[@]}"; do SETS_BIG+=("$kv"); done
step bench_train_base python scripts/bench_train.py --device "$DEVICE" --steps "$BENCH_STEPS" --set "${SETS_BASE[@]}"
# All of Multi30k's pairs: 6000 (the default) make only three or four 25k-token batches.
step bench_train_base_25k python scripts/bench_train.py --device "$DEVICE" --steps "$BENCH_STEPS" --rounds 2 \
  --pairs 29000 --set "${SIZES_BASE_25K[@]}"
step bench_train_big python scripts/bench_train.py --device "$DEVICE" --steps "$BENCH_STEPS" --set "${SETS_BIG[@]}"
# Compiled vs eager on the same bucketed batches (train.length_bucket 8): the trainer's own
# compiled step (model + loss, train/forward_loss.py), CUDA graphs on CUDA.
step bench_train_base_bucketed python scripts/bench_train.py --device "$DEVICE" --steps "$BENCH_STEPS" --length-bucket 8 \
  --set "${SETS_BASE[@]}"
step bench_train_base_compiled python scripts/bench_train.py --device "$DEVICE" --steps "$BENCH_STEPS" --compile \
  --length-bucket 8 --set "${SETS_BASE[@]}"
for log in bench_train_base bench_train_base_25k bench_train_big bench_train_base_bucketed bench_train_base_compiled; do
  [[ -f "$OUT/$log.log" ]] || continue
  echo "-- $log" >> "$SUMMARY"
  grep -hE "^(machine|peak|xformer|torch\.nn|ratio|config|conventional|kernels|aten|precision)" "$OUT/$log.log" >> "$SUMMARY"
done

# 3a. packed vs dynamic batches in the real trainer (issue 20: one static shape), paper-base model on
# WMT-news, the same minutes each; the summary gets the median target tokens/s of each run.
BATCHING_MINUTES="${GPU_CHECK_BATCHING_MINUTES:-1.5}"
BATCHING_SETS=(--set "train.device=$DEVICE" --set "train.max_minutes=$BATCHING_MINUTES" --set train.valid_every=100000
               --set train.average_last=0 --set train.max_tokens=8000 --set model.d_model=512 --set model.d_ff=2048
               --set model.n_heads=8)
[[ "$QUICK" == 1 ]] && BATCHING_SETS+=("${WMT_SETS[@]}" --set train.max_tokens=1000)
for variant in dynamic packed packed_compiled; do
  batching="${variant%_compiled}"
  compile=$([[ "$variant" == *_compiled ]] && echo true || echo false)
  step "batching_$variant" xformer train -c configs/wmt-news.yaml --quiet --overwrite "${BATCHING_SETS[@]}" \
    --set "run_dir=$OUT/batching_$variant" --set "train.batching=$batching" --set "train.compile=$compile"
  python - "$OUT/batching_$variant/metrics.jsonl" "$variant" >> "$SUMMARY" 2>/dev/null <<'PY'
import json, statistics, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if "tokens_per_s" in r]
print(f"batching {sys.argv[2]}: median {statistics.median(r['tokens_per_s'] for r in rows[1:] or rows):.0f} target tokens/s "
      f"over {len(rows)} log lines, step {rows[-1]['step'] if rows else 0}")
PY
done

# 3b. the Multi30k GPU config (issue 20's target: test2016 sacreBLEU >= 40, beam 4, within 10 minutes)
if [[ -f configs/multi30k-gpu.yaml ]]; then
  step multi30k_gpu xformer train -c configs/multi30k-gpu.yaml --quiet --overwrite --set "run_dir=$OUT/m30k-gpu" \
    --set "train.device=$DEVICE" "${M30K_GPU_SETS[@]}"
  # Every validation's BLEU, the averaging and the length-penalty search: what tuning on valid reads.
  python - "$OUT/m30k-gpu/metrics.jsonl" >> "$SUMMARY" 2>/dev/null <<'PY'
import json, sys
for row in map(json.loads, open(sys.argv[1])):
    if "averaged_steps" in row:
        print(f"  average of steps {row['averaged_steps']}: valid BLEU {row['valid_bleu']} (loss {row['valid_loss']})")
    elif "valid_bleu" in row:
        print(f"  step {row['step']} ({row['minutes']} min, epoch {row['epoch']}): valid BLEU {row['valid_bleu']} (loss {row['valid_loss']})")
    elif "length_penalty" in row:
        print(f"  length penalty {row['length_penalty']} chosen: valid BLEU by alpha {row['length_penalty_valid_bleu']}")
PY
  M30K_TEST="$DATA/multi30k/test2016"; M30K_LINES=$([[ "$TEST_LINES" != 0 ]] && echo "$TEST_LINES" || echo 1000000)
  head -n "$M30K_LINES" "$M30K_TEST.en" > "$OUT/test2016.en"; head -n "$M30K_LINES" "$M30K_TEST.de" > "$OUT/test2016.de"
  step bleu_multi30k_gpu xformer eval-bleu -m "$OUT/m30k-gpu/best.pt" --device "$DEVICE" --beam-size 4 \
    --src "$OUT/test2016.en" --ref "$OUT/test2016.de" --output "$OUT/test2016.hyp.de"
  grep -E "^BLEU|^chrF" "$OUT/bleu_multi30k_gpu.log" >> "$SUMMARY" 2>/dev/null
else
  note "SKIP multi30k_gpu: configs/multi30k-gpu.yaml does not exist yet"
fi

# 4. a short real training on WMT news, scored on newstest2014
step train_wmt_news xformer train -c configs/wmt-news.yaml --quiet --overwrite --set "run_dir=$OUT/wmt-news" \
  --set "train.device=$DEVICE" --set "train.max_minutes=$MINUTES" --set train.valid_every=500 "${WMT_SETS[@]}"
grep -E "valid_bleu" "$OUT/wmt-news/metrics.jsonl" 2>/dev/null | tail -2 >> "$SUMMARY"
TEST_SRC="$DATA/wmt14/newstest2014.en"; TEST_REF="$DATA/wmt14/newstest2014.de"
if [[ "$TEST_LINES" != 0 ]]; then  # quick: the first lines only
  head -n "$TEST_LINES" "$TEST_SRC" > "$OUT/test.en"; head -n "$TEST_LINES" "$TEST_REF" > "$OUT/test.de"
  TEST_SRC="$OUT/test.en"; TEST_REF="$OUT/test.de"
fi
step bleu_newstest2014 xformer eval-bleu -m "$OUT/wmt-news/best.pt" --device "$DEVICE" \
  --src "$TEST_SRC" --ref "$TEST_REF" --output "$OUT/newstest2014.hyp.de"
grep -E "^BLEU|^chrF" "$OUT/bleu_newstest2014.log" >> "$SUMMARY" 2>/dev/null

# 5. decoding speed on that checkpoint
step bench_decode python scripts/bench_decode.py --checkpoint "$OUT/wmt-news/best.pt" --device "$DEVICE" \
  --src "$DATA/wmt14/newstest2014.en" --ref "$DATA/wmt14/newstest2014.de" --sentences "$SENTENCES" --no-uncached
grep -hE "^ *[0-9]+ +\(|^beam|^machine" "$OUT/bench_decode.log" >> "$SUMMARY" 2>/dev/null

# 6. throughput at the paper's sizes and 25k tokens: the step profiled, then the whole trainer
PROFILE_PAIRS=$([[ "$QUICK" == 1 ]] && echo 2000 || echo 29000)
PROFILE_STEPS=$([[ "$QUICK" == 1 ]] && echo 2 || echo 8)
step profile_base_25k python scripts/profile_train_step.py --device "$DEVICE" --precision fp32 bf16 \
  --steps "$PROFILE_STEPS" --pairs "$PROFILE_PAIRS" --set "${SIZES_BASE_25K[@]}"
step profile_big_25k python scripts/profile_train_step.py --device "$DEVICE" --precision fp32 bf16 \
  --steps "$PROFILE_STEPS" --pairs "$PROFILE_PAIRS" --set "${SIZES_BIG[@]}" train.max_tokens="${SIZES_BASE_25K[-1]#*=}"
for log in profile_base_25k profile_big_25k; do
  [[ -f "$OUT/$log.log" ]] && { echo "-- $log" >> "$SUMMARY"; grep -hE "^(model|== precision|GPU kernel)" "$OUT/$log.log" >> "$SUMMARY"; }
done
TRAINER_MINUTES=$([[ "$QUICK" == 1 ]] && echo 0.3 || echo 1.0)
TRAINER_SETS=(--set "train.device=$DEVICE" --set train.valid_every=100000 --set train.average_last=0
              --set train.tune_length_penalty=[] --set data.valid_max_sentences=8 --set train.log_every=10
              --set train.batching=packed)
BIG_25K=("${SIZES_BIG[@]}" train.max_tokens="${SIZES_BASE_25K[-1]#*=}")
# name, sizes (an array's name), compile, precision (auto = bf16 on the GPU; fp32 = TF32 products)
for variant in "base_25k_packed SIZES_BASE_25K false auto" "base_25k_packed_compiled SIZES_BASE_25K true auto" \
               "big_25k_packed BIG_25K false auto" "base_25k_packed_tf32 SIZES_BASE_25K false fp32" \
               "big_25k_packed_tf32 BIG_25K false fp32"; do
  read -r name sizes compile precision <<< "$variant"
  if [[ -n "$ONLY" && " $ONLY " != *" trainer_$name "* ]]; then continue; fi
  declare -n size_list="$sizes"
  sets=("${TRAINER_SETS[@]}"); for kv in "${size_list[@]}"; do sets+=(--set "$kv"); done
  minutes=$([[ "$compile" == true ]] && awk "BEGIN { print $TRAINER_MINUTES + 1.5 }" || echo "$TRAINER_MINUTES")
  step "trainer_$name" xformer train -c configs/multi30k.yaml --quiet --overwrite "${sets[@]}" \
    --set "run_dir=$OUT/trainer_$name" --set "train.compile=$compile" --set "train.max_minutes=$minutes" \
    --set "train.precision=$precision"
  unset -n size_list
  # The second half of the log windows (compilation and warm-up over), and how many windows
  # ran under 60% of the median: what a save or a validation that holds the loop leaves.
  python - "$OUT/trainer_$name/metrics.jsonl" "trainer $name" >> "$SUMMARY" 2>/dev/null <<'PY'
import json, statistics, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if "tokens_per_s" in r]
steady = rows[len(rows) // 2:] or rows
median = statistics.median(r["tokens_per_s"] for r in steady)
slow = sum(r["tokens_per_s"] < 0.6 * median for r in rows[1:])
print(f"{sys.argv[2]}: median {median:.0f} target tokens/s over the last {len(steady)} of {len(rows)} log lines, "
      f"step {rows[-1]['step'] if rows else 0}; {slow} windows under 60% of it")
PY
done

# 9. the GPU pipeline (issue 49): every stage, then each model's test2016 BLEU at beam 4 on the GPU,
# also when a stage fails (export needs ctranslate2, carried as a wheel; its CUDA build loads libcublas.so.12,
# which the lent machine's CUDA 13 image does not list: evaluate's int8 row then runs on the CPU, its log says)
PIPELINE_SETS=(--set "run_dir=$OUT/pipeline-gpu")
[[ "$QUICK" == 1 ]] && PIPELINE_SETS+=(--set mono.max_lines=300 --set model_set.data.train.max_pairs=600
  --set model_set.data.valid_max_sentences=40 --set model_set.tokenizer.vocab_size=600 --set model_set.model.d_model=64
  --set model_set.model.d_ff=128 --set model_set.model.n_heads=2 --set model_set.train.max_minutes=0
  --set model_set.train.max_steps=30 --set model_set.train.validations=0 --set model_set.train.valid_every=30
  --set model_set.train.save_every=15 --set model_set.train.average_last=2 --set "model_set.train.tune_length_penalty=[0.6, 1.0]"
  --set "model_set.train.device=$DEVICE" --set backtranslate.chunk_lines=100 --set distill.chunk_lines=100
  --set evaluate.max_lines=40)
for kv in ${GPU_CHECK_PIPELINE_SETS:-}; do PIPELINE_SETS+=(--set "$kv"); done
test2016_beam4() {  # test2016_beam4 RUN_DIR...: each run's valid line(s) and its best.pt scored on the GPU
  local run failed=0
  for run in "$@"; do
    [[ -f "$run/best.pt" ]] || continue
    echo "== $run test2016 beam 4 ($DEVICE)"
    grep -h '"valid_bleu"\|"length_penalty"' "$run/metrics.jsonl" 2>/dev/null | cut -c1-300
    xformer eval-bleu -m "$run/best.pt" --device "$DEVICE" --beam-size 4 \
      --src "$DATA/multi30k/test2016.en" --ref "$DATA/multi30k/test2016.de" || failed=1
  done
  return "$failed"
}
pipeline_gpu() {
  local failed=0
  xformer pipeline -c configs/multi30k-pipeline-gpu.yaml --quiet "${PIPELINE_SETS[@]}" || failed=1
  xformer pipeline -c configs/multi30k-pipeline-gpu.yaml "${PIPELINE_SETS[@]}" --status
  # the models that exist, scored on the GPU whatever evaluate did
  test2016_beam4 "$OUT/pipeline-gpu/teacher" "$OUT/pipeline-gpu/student" || failed=1
  return "$failed"
}
step pipeline_gpu pipeline_gpu
grep -hE "^(== |BLEU|chrF|numbers|\| |stage )|minutes of stages" "$OUT/pipeline_gpu.log" >> "$SUMMARY" 2>/dev/null

# 10. the GPU pipeline's first half (issue 49's +1.5): a reverse model of $GPU_CHECK_REVERSE_MINUTES, its
# back-translation of $GPU_CHECK_BT_LINES lines of mono.de, then the tagged teacher and the plain
# configs/multi30k-gpu.yaml side by side on the one GPU for the same minutes, each scored on test2016
BT_RUN="$OUT/bt-teacher"
BT_SETS=(--set "run_dir=$BT_RUN" --set "reverse.set.train.max_minutes=${GPU_CHECK_REVERSE_MINUTES:-1.0}"
         --set "mono.max_lines=${GPU_CHECK_BT_LINES:-60000}")
[[ -n "${GPU_CHECK_SYNTHETIC_UNTIL:-}" ]] && BT_SETS+=(--set "teacher.synthetic_until=$GPU_CHECK_SYNTHETIC_UNTIL")
[[ -n "${GPU_CHECK_REAL_TARGETS:-}" ]] && BT_SETS+=(--set "backtranslate.real_targets=$GPU_CHECK_REAL_TARGETS")
BASELINE_SETS=(--set "run_dir=$OUT/bt-baseline" --set "train.device=$DEVICE")
if [[ "$QUICK" == 1 ]]; then
  BT_SETS+=("${PIPELINE_SETS[@]:2}")  # the pipeline's tiny models (its run_dir left out)
  BASELINE_SETS+=("${M30K_GPU_SETS[@]}")
fi
bt_teacher() {
  local stage failed=0 pid
  for stage in reverse backtranslate; do
    xformer pipeline -c configs/multi30k-pipeline-gpu.yaml --quiet "${BT_SETS[@]}" --only "$stage" || return 1
  done
  xformer train -c configs/multi30k-gpu.yaml --quiet --overwrite "${BASELINE_SETS[@]}" > "$OUT/bt_baseline.log" 2>&1 &
  pid=$!
  xformer pipeline -c configs/multi30k-pipeline-gpu.yaml --quiet "${BT_SETS[@]}" --only teacher || failed=1
  wait "$pid" || { failed=1; tail -3 "$OUT/bt_baseline.log"; }
  test2016_beam4 "$BT_RUN/teacher" "$OUT/bt-baseline" || failed=1
  return "$failed"
}
step bt_teacher bt_teacher
grep -hE "^(== |BLEU|chrF|numbers|stage |\{)|minutes of stages" "$OUT/bt_teacher.log" >> "$SUMMARY" 2>/dev/null
# where the GPU's translation time goes (the stages' ~1200 lines/s at any batch size in the sixth lease):
# the teacher translating mono.en in the GPU config's batches, under the profiler
DECODE_LINES=$([[ "$QUICK" == 1 ]] && echo 200 || echo 8000)
step profile_decode python scripts/profile_decode.py --checkpoint "$BT_RUN/teacher/best.pt" --device "$DEVICE" \
  --input "$DATA/multi30k/mono.en" --lines "$DECODE_LINES" --batch-size 4000 --max-tokens 240000
grep -hE "sentences/s|^host|^GPU kernel|^  [a-z]" "$OUT/profile_decode.log" >> "$SUMMARY" 2>/dev/null

# 8. transfer to a small pair (issue 27 goal 2): runs side by side get the same wall-clock time
TRANSFER_RUNS=(b-bi-mid-pre-drop3-gpu b-multi-mid-pre-gpu b-multi-big-pre-gpu)
TRANSFER_MINUTES="${GPU_CHECK_TRANSFER_MINUTES:-$([[ "$QUICK" == 1 ]] && echo 0.1 || echo 3)}"
# a run's limit: its minutes, then the tokenizer, averaging, the length-penalty pass and test2016
# (a quick rehearsal's untrained models decode to the length limit on a CPU: longer)
TRANSFER_LIMIT=$(awk -v m="$TRANSFER_MINUTES" -v after="$([[ "$QUICK" == 1 ]] && echo 900 || echo 180)" \
  'BEGIN { printf "%d", m * 60 + after }')
transfer() {
  local run pid failed=0 pids=()
  for run in "${TRANSFER_RUNS[@]}"; do
    PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 TRANSFER_DEVICE="$DEVICE" TRANSFER_MINUTES="$TRANSFER_MINUTES" timeout -s ABRT -k 10 \
      "$TRANSFER_LIMIT" bash scripts/bench_multilingual_quality.sh "$run" "$OUT/transfer" > "$OUT/transfer_$run.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  # each run's test2016 scores (a multilingual run: its en->cs row) into the summary
  grep -H -E "^BLEU =|^chrF2 =|^en->cs +[0-9]" "$OUT"/transfer_*.log | tee -a "$SUMMARY"
  return "$failed"
}
step transfer transfer

note "failures: $FAILED"
echo "summary: $SUMMARY" >&2
exit "$FAILED"
