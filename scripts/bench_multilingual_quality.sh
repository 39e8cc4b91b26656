#!/bin/bash
# The issue-27 quality runs on Multi30k (docs/benchmarks/multilingual.md, "Multilingual models, phase 2"): one
# small model and batch for every run, bounded by steps (not minutes) so that the figures do not
# depend on the machine's load; then test2016 per direction, beam 4, fp32.
#
#   scripts/bench_multilingual_quality.sh RUN [WORK]      WORK: runs/quality by default
#
# RUN: bi-ende, bi-enfr, bi-encs (1000 steps each), multi (en->de,fr,cs, 3000 steps: three times
# the bilingual budget), b-bi (en->cs on the first 3000 pairs), b-multi (en->de, en->fr in full
# and en->cs on those 3000 pairs, sampling temperature 5), b-direct (b-multi and de->cs, fr->cs on
# the same 3000 lines: Multi30k is multi-parallel); a suffix -s2 trains with seed 2,
# -long gives b-bi / b-multi 3000 steps in place of 500, -xlong 6000, -mid the default config's model (d_model
# 256, 3+3 layers), -pre pre-norm layers; suffixes in the order -long-mid-pre-s2 (or -xlong-...)). Data: $XFORMER_DATA/multi30k
# (default ../shared/data). On a GPU: a -gpu suffix (last) trains on CUDA for
# $TRANSFER_MINUTES minutes (default 3.5) in place of steps, 6000-token batches, planned validations:
# runs started side by side on one GPU then get the same wall-clock time; -big the paper's base
# shape (512 wide, 6+6 layers), -drop3 dropout 0.3 (a bilingual 3,000-pair baseline regularised
# harder). Full order of suffixes: -long-mid-pre-drop3-s2-gpu (-big in place of -mid).
set -euo pipefail
# The lent GPU machine has no installed xformer (PYTHONPATH=$PWD there): the module instead.
if command -v xformer > /dev/null; then XF=(xformer); else XF=(python3 -m xformer_cli); fi
RUN=$1
WORK=${2:-runs/quality}
D=$(cd "${XFORMER_DATA:-../shared/data}/multi30k" && pwd)
mkdir -p "$WORK"
CS3K="$WORK/cs3k/train"
mkdir -p "$WORK/cs3k"
for lang in en cs de fr; do  # written then renamed: runs started side by side never read half a file
  [ -f "$CS3K.$lang" ] || { head -3000 "$D/train.$lang" > "$CS3K.$lang.$$" && mv "$CS3K.$lang.$$" "$CS3K.$lang"; }
done
COMMON=(-s data.train.fallback_dataset=null -s data.valid.fallback_dataset=null -s data.test.fallback_dataset=null
        -s "data.train.prefix=$D/train" -s "data.valid.prefix=$D/valid" -s "data.test.prefix=$D/test2016"
        -s train.max_minutes=0 -s train.threads=1 -s train.save_every=0 -s train.keep_checkpoints=0
        -s train.average_last=0 -s data.valid_max_sentences=300
        -s "train.dropout_by_planned_epochs={}" -s "train.label_smoothing_by_planned_epochs={}"
        -s model.d_model=128 -s model.d_ff=512 -s model.n_heads=4 -s model.encoder_layers=2 -s model.decoder_layers=2 -s model.pre_norm=false
        -s train.max_tokens=2000 -s train.warmup_steps=400 -s train.lr_scale=0.7 -s train.valid_every=500
        -s train.validations=0 -s train.cooldown=0.5 -s train.precision=bf16 -s train.log_every=25 -s decode.max_len_a=1.2
        -s decode.max_len_b=10 "-s" "train.tune_length_penalty=[0.6,1.0,1.4,2.0]")
MORE=()
NAME=$RUN
EVAL_DEVICE=(--precision fp32 --threads 1)
case $RUN in *-gpu) DEVICE=${TRANSFER_DEVICE:-cuda}
                    MORE+=(-s "train.device=$DEVICE" -s "train.max_minutes=${TRANSFER_MINUTES:-3.5}" -s train.max_steps=1000000
                           -s train.validations=4 -s train.max_tokens=6000 -s train.save_every=250 -s train.keep_checkpoints=5
                           -s train.average_last=5)
                    EVAL_DEVICE=(--device "$DEVICE" --precision fp32); RUN=${RUN%-gpu} ;; esac
case $RUN in *-s2) MORE+=(-s train.seed=2); RUN=${RUN%-s2} ;; esac
case $RUN in *-drop3) MORE+=(-s model.dropout=0.3); RUN=${RUN%-drop3} ;; esac
case $RUN in *-pre) MORE+=(-s model.pre_norm=true); RUN=${RUN%-pre} ;; esac
case $RUN in *-mid) MORE+=(-s model.d_model=256 -s model.d_ff=1024 -s model.encoder_layers=3 -s model.decoder_layers=3)
                    RUN=${RUN%-mid} ;;
             *-big) MORE+=(-s model.d_model=512 -s model.d_ff=2048 -s model.n_heads=8 -s model.encoder_layers=6
                           -s model.decoder_layers=6); RUN=${RUN%-big} ;; esac
case $RUN in *-long) LONG=(-s train.max_steps=3000 -s train.valid_every=750); RUN=${RUN%-long} ;;
             *-xlong) LONG=(-s train.max_steps=6000 -s train.valid_every=1500); RUN=${RUN%-xlong} ;; *) LONG=() ;; esac
BI=configs/multi30k.yaml
MULTI=configs/multi30k-multilingual.yaml
case $RUN in
  bi-ende|bi-enfr|bi-encs) CFG=$BI; ARGS=(-s "data.tgt_lang=${RUN#bi-en}" -s tokenizer.vocab_size=3000 -s train.max_steps=1000) ;;
  multi) CFG=$MULTI; ARGS=(-s tokenizer.vocab_size=5000 -s train.max_steps=3000 -s train.valid_every=750
                           -s train.length_penalty_by_target=true) ;;
  b-bi) CFG=$BI; ARGS=(-s data.tgt_lang=cs -s "data.train.prefix=$CS3K" -s tokenizer.vocab_size=3000 -s train.max_steps=500) ;;
  b-multi|b-direct)  # en->cs on the 3000 lines; b-direct also de->cs and fr->cs on the same lines
    CFG=$MULTI; INTO_CS="{src_lang: en, tgt_lang: cs, train: [{prefix: $CS3K}]}"
    [ "$RUN" = b-direct ] && for src in de fr; do INTO_CS+=", {src_lang: $src, tgt_lang: cs, train: [{prefix: $CS3K}]}"; done
    ARGS=(-s tokenizer.vocab_size=5000 -s train.max_steps=500 -s data.sampling_temperature=5
          -s train.length_penalty_by_target=true -s "data.pairs=[en-de, en-fr, $INTO_CS]") ;;
  *) echo "unknown run $RUN" >&2; exit 2 ;;
esac
start=$(date +%s)
nice -n 5 "${XF[@]}" train -c "$CFG" --overwrite -q -s "run_dir=$WORK/$NAME" "${COMMON[@]}" "${ARGS[@]}" "${LONG[@]}" \
  "${MORE[@]}"
echo "$NAME: trained in $(( $(date +%s) - start )) s"
start=$(date +%s)
nice -n 5 "${XF[@]}" eval-bleu -m "$WORK/$NAME/best.pt" -b 4 "${EVAL_DEVICE[@]}" | tee "$WORK/eval-$NAME.txt"
echo "$NAME: evaluated in $(( $(date +%s) - start )) s"
