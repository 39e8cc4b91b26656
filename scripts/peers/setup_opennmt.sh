#!/usr/bin/env bash
# Install OpenNMT-py 3.5.1 as a benchmark peer, on the same torch as xformer (2.13.0).
#
#   scripts/peers/setup_opennmt.sh [VENV]        # VENV defaults to /tmp/onmt-venv
#
# Idempotent: re-running reuses VENV and only installs what is missing.
#
# Order matters:
#   1. torch==2.13.0 first. On our CPU machines pip resolves this to the local CPU wheel
#      (pip's find-links /opt/wheels); an unpinned torch would pull the CUDA build and
#      gigabytes of nvidia-* packages.
#   2. OpenNMT-py==3.5.1 with --no-deps: it declares torch<2.3,>=2.1, which would
#      otherwise downgrade torch.
#   3. The packages OpenNMT-py imports when onmt_build_vocab / onmt_train /
#      onmt_translate start, installed by name under a constraint that keeps torch at
#      2.13.0. Several are compiled wheels, not pure Python (pyonmttok, numpy, regex,
#      rapidfuzz, pyahocorasick, fasttext-wheel, spacy).
#      onmt/transforms/__init__.py imports every transform module, so the optional
#      transforms' imports are needed at start-up even when unused:
#        terminology.py -> spacy, ahocorasick   (spacy is the heavy one, ~200 MB with thinc/blis)
#        clean.py       -> fasttext, regex
#        fuzzymatch.py  -> rapidfuzz, numpy
#        inlinetags.py  -> ahocorasick
#        normalize.py   -> regex
#      and: inputters/inputter.py -> pyonmttok; opts.py -> configargparse;
#      scorers/ -> sacrebleu; utils/parse.py -> yaml (pyyaml); the sentencepiece
#      transform -> sentencepiece (imported when the transform is used).
#      Left out on purpose (imported lazily or only by other tools): ctranslate2,
#      tensorboard (only with -tensorboard), flask + waitress (onmt_server),
#      safetensors (only with -save_format safetensors), six (never imported).
set -euo pipefail

VENV="${1:-/tmp/onmt-venv}"
TORCH_VERSION="2.13.0"
ONMT_VERSION="3.5.1"
# Versions verified with OpenNMT-py 3.5.1 + torch 2.13.0+cpu on Python 3.11 (2026-11-21).
RUNTIME_DEPS=(
  "pyonmttok==1.38.1"
  "configargparse==1.9.0"
  "pyyaml==6.0.3"
  "numpy==2.4.6"
  "sacrebleu==2.6.0"
  "sentencepiece==0.2.3"
  "regex==2026.11.15"
  "rapidfuzz==3.14.6"
  "pyahocorasick==2.3.1"
  "fasttext-wheel==0.9.2"
  "spacy==3.8.18"
)

if [[ ! -x "$VENV/bin/python" ]]; then
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check)

# 1. torch first (already-satisfied is a no-op).
"${PIP[@]}" install "torch==${TORCH_VERSION}"

# 2. OpenNMT-py without its dependency pins.
"${PIP[@]}" install --no-deps "OpenNMT-py==${ONMT_VERSION}"

# 3. Runtime dependencies, never letting anything move torch.
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
echo "torch==${TORCH_VERSION}" > "$constraints"
"${PIP[@]}" install -c "$constraints" "${RUNTIME_DEPS[@]}"

# Check: the right torch, and the three entry points start.
PYTHONWARNINGS="ignore::FutureWarning" "$PY" - <<EOF
import torch, onmt, importlib.metadata as md
v = torch.__version__
assert v.startswith("${TORCH_VERSION}"), f"torch is {v}, expected ${TORCH_VERSION}"
print("torch", v, "| cuda build:", torch.version.cuda, "| OpenNMT-py", md.version("OpenNMT-py"))
EOF
for cmd in onmt_build_vocab onmt_train onmt_translate; do
  # -W ignore::FutureWarning: torch 2.13 warns about torch.cuda.amp.custom_fwd/bwd
  # used by onmt/modules/{sparse_activations,sparse_losses,sru}.py; harmless.
  PYTHONWARNINGS="ignore::FutureWarning" "$VENV/bin/$cmd" -h > /dev/null
  echo "$cmd -h: ok"
done
echo "OpenNMT-py ${ONMT_VERSION} ready in $VENV (activate: . $VENV/bin/activate)"
