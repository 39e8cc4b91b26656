#!/usr/bin/env bash
# Number accuracy (eval-bleu's, docs/evaluation.md#number-accuracy) beside BLEU, on the lines
# of a test set whose source holds digits: issue 28's "numbers, before and after".
#
#   scripts/bench_numbers.sh CHECKPOINT OUT_DIR [BEFORE_TREE]
#
# Each test set (test2016 and newstest2014, English -> German) is cut to its lines with digits
# (the number accuracy of the whole file is the same: other lines hold no source number), then
# translated by `xformer translate` (beam 4; the model's output) and by `--keep-numbers`, and
# scored with `eval-bleu --hyp --src --ref`. The references are scored as a hypothesis too: how
# many numbers a human translation keeps by these rules. BEFORE_TREE, a checkout of an older
# xformer (e.g. `git worktree add /tmp/before a3f64bd`), translates the same lines with its
# `translate` as it was (its automatic number protection): the "before" row.
set -euo pipefail
checkpoint=$1; out=$2; before=${3:-}
data=${XFORMER_DATA:-../shared/data}
mkdir -p "$out"
here=$(pwd)

digit_lines() {  # $1 source, $2 target, $3 out prefix: the pairs whose source has a digit
  python - "$1" "$2" "$3" <<'EOF'
import re, sys
src, tgt = (open(p, encoding="utf-8").read().split("\n") for p in sys.argv[1:3])
pairs = [(s, t) for s, t in zip(src, tgt) if re.search(r"\d", s)]
for side, i in (("en", 0), ("de", 1)):
    with open(f"{sys.argv[3]}.{side}", "w", encoding="utf-8") as f:
        f.write("".join(p[i] + "\n" for p in pairs))
print(f"{sys.argv[1]}: {len(pairs)} lines with digits")
EOF
}

score() {  # $1 label, $2 hypothesis, $3 prefix
  printf '%-40s ' "$1"
  xformer eval-bleu --hyp "$2" --src "$3.en" --ref "$3.de" --json \
    | python -c 'import json,sys; d=json.load(sys.stdin); n=d["numbers"]; b=d["BLEU"]["score"]
print("BLEU %6.2f  numbers %6.2f%% (%d of %d)" % (b, n["accuracy"], n["kept"], n["total"]))'
}

if [ -n "$before" ]; then  # the checkpoint with only the config keys the older xformer knows
  (cd "$before" && python - "$here/$checkpoint" "$here/$out/before.pt" <<'EOF'
import dataclasses, sys, typing, torch
from xformer_cli import config as old
state = torch.load(sys.argv[1], map_location="cpu", weights_only=True)
hints = typing.get_type_hints(old.Config)
def known(cls, tree):
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in tree.items() if k in names}
state["config"] = {name: known(hints[name], tree) if isinstance(tree, dict) and dataclasses.is_dataclass(hints[name]) else tree
                   for name, tree in state["config"].items() if name in hints}
torch.save(state, sys.argv[2])
EOF
  )
fi

for set in "multi30k/test2016" "wmt14/newstest2014"; do
  name=$(basename "$set"); prefix="$out/$name.digits"
  digit_lines "$data/$set.en" "$data/$set.de" "$prefix"
  start=$(date +%s)
  xformer translate -m "$checkpoint" --beam-size 4 < "$prefix.en" > "$prefix.model.de"
  echo "  translate: $(( $(date +%s) - start )) s"
  xformer translate -m "$checkpoint" --beam-size 4 --keep-numbers < "$prefix.en" > "$prefix.keep.de"
  if [ -n "$before" ]; then
    (cd "$before" && python -m xformer_cli translate -m "$here/$out/before.pt" --beam-size 4 \
      < "$here/$prefix.en" > "$here/$prefix.before.de")
    score "$name: before (older translate)" "$prefix.before.de" "$prefix"
  fi
  score "$name: translate (the model's output)" "$prefix.model.de" "$prefix"
  score "$name: translate --keep-numbers" "$prefix.keep.de" "$prefix"
  score "$name: the reference" "$prefix.de" "$prefix"
  python - "$prefix" <<'EOF'
import re, sys
p = sys.argv[1]
rows = [open(f"{p}.{k}", encoding="utf-8").read().split("\n") for k in ("en", "model.de", "keep.de")]
twice = sum(bool(re.search(r"\b\d+ (?:[Zz]wei|[Dd]rei|[Vv]ier|[Ff]ünf|[Ss]echs|[Ss]ieben|[Aa]cht|[Nn]eun|[Zz]ehn)\b", k))
            for k in rows[2])
changed = sum(m != k for m, k in zip(rows[1], rows[2]))
loops = sum(bool(re.search(r"(\b\d+\b)( \1\b)+", m)) for m in rows[1][:-1])  # "1 1 102", "555 555": a copy loop
print(f"  --keep-numbers changed {changed} lines; lines with a digit beside a German number word: {twice}")
print(f"  the model's lines writing a run of digits twice or more in a row (a copy loop): {loops} of {len(rows[1]) - 1}")
EOF
done
