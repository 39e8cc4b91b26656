"""Precision names, one definition: which ``train.precision`` takes and which ``--precision``
(translate, eval-bleu, serve) takes. No torch here, so ``config.py`` can check a config
without importing it; ``device.py`` decides what the hardware makes of a name."""

# train.precision: what the training step's autocast runs in (device.resolve_precision).
TRAINING_PRECISIONS = ("auto", "bf16", "fp16", "fp32")

# What the xformer (PyTorch) engine translates in.
TORCH_DECODE_PRECISIONS = ("fp32", "bf16", "fp16")
# The translation engines (decode/factory.py builds them; auto: its rules choose).
ENGINES = ("auto", "xformer", "ctranslate2")
# The names device.resolve_decode_precision decides on: PyTorch's, and int8 (CTranslate2's int8 weights).
DEVICE_DECODE_PRECISIONS = ("auto", *TORCH_DECODE_PRECISIONS, "int8")
# CTranslate2's own compute types: --precision takes them as well, and they select that engine.
CT2_ONLY_PRECISIONS = ("int8_float32", "int8_bfloat16", "int8_float16", "int16", "float32", "bfloat16", "float16")
# The weight types a CTranslate2 export is quantized to (its spec.optimize takes these names).
EXPORT_QUANTIZATIONS = ("int8", *CT2_ONLY_PRECISIONS)
# Every name --precision takes (decode/factory.py checks it).
DECODE_PRECISIONS = (*DEVICE_DECODE_PRECISIONS, *CT2_ONLY_PRECISIONS)
