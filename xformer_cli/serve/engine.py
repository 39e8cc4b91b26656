"""The one place the server touches a translation engine: load it, and call ``translate``.

Both engines (xformer's PyTorch ``Translator`` and the CTranslate2 export's
``CTranslate2Translator``) offer ``decode.engine.Engine``'s interface; the server uses only
its ``translate(lines, beam_size=...) -> list[str]`` (one output per line, blank in, blank out).

``-m`` may be:
- a checkpoint (``.pt``) with ``engine="xformer"``: PyTorch, ``precision`` auto, fp32, bf16,
  or int8 (CTranslate2 on an int8 export made at start, as ``xformer translate`` does);
- a directory written by ``xformer export`` with ``engine="ctranslate2"``;
- a checkpoint with ``engine="ctranslate2"``: exported at start to a temporary directory
  (int8 weights when ``precision`` is int8), loaded, and the directory removed.
With CTranslate2, ``precision`` picks its compute type: auto = the export's own, fp32 =
float32, bf16 = bfloat16 (where the device has it), int8 = int8.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from xformer_cli.decode.engine import Engine, load_engine
from xformer_cli.errors import XformerError

ENGINES = ("xformer", "ctranslate2")
CT2_COMPUTE_TYPES = {"auto": "default", "fp32": "float32", "bf16": "bfloat16", "int8": "int8"}


@dataclass
class ServedModel:
    """A loaded engine and what the server shows about it."""

    translator: Engine  # a decode engine: .translate(lines, beam_size=...), .truncated_lines
    name: str  # shown on the page and in /health
    engine: str  # xformer | ctranslate2
    precision: str
    source: str  # language codes
    target: str
    beam_size: Optional[int]  # the model's default beam, None if unknown

    def translate(self, texts: list[str], beam_size: Optional[int] = None) -> list[str]:
        return self.translator.translate(texts, beam_size=beam_size or self.beam_size)

    @property
    def truncated_lines(self) -> int:
        return getattr(self.translator, "truncated_lines", 0)


def load_served_model(
    model: "str | Path",
    engine: str = "xformer",
    device: str = "auto",
    precision: str = "auto",
    source: Optional[str] = None,
    target: Optional[str] = None,
    name: Optional[str] = None,
    threads: int = 0,
    log: Callable[[str], None] = lambda message: None,
) -> ServedModel:
    """Load ``model`` for serving; ``source``/``target`` override the recorded language codes;
    ``threads``: CTranslate2's (0: its default; PyTorch's are set by the caller)."""
    path = Path(model)
    if engine not in ENGINES:
        raise XformerError(f"--engine must be xformer or ctranslate2, not {engine!r}")
    if not path.exists():
        raise XformerError(f"model not found: {path}")
    if engine == "xformer":
        if path.is_dir():
            raise XformerError(f"{path} is a directory: serve an export with --engine ctranslate2, or give a checkpoint file")
        translator = load_engine(path, "xformer", device=device, precision=precision)
        shown_precision = getattr(translator, "precision", "int8")  # int8 comes back as the CTranslate2 engine
        engine = translator.name
        recorded = checkpoint_languages(path)
    else:
        if precision not in CT2_COMPUTE_TYPES:
            raise XformerError(f"--precision must be one of {', '.join(CT2_COMPUTE_TYPES)}, not {precision!r}")
        translator = _ct2_translator(path, device, precision, threads, log)
        shown_precision = CT2_COMPUTE_TYPES[precision] if precision != "auto" else _export_weights(path)
        recorded = export_languages(path) if path.is_dir() else checkpoint_languages(path)
    if recorded is None and not (source and target):
        log(f"warning: {path} records no language codes; serving en->de (set --source and --target)")
    src, tgt = recorded or ("en", "de")
    decode = getattr(translator, "decode", None)
    return ServedModel(
        translator=translator,
        name=name or _model_name(path),
        engine=engine,
        precision=shown_precision,
        source=source or src,
        target=target or tgt,
        beam_size=getattr(decode, "beam_size", None),
    )


def _ct2_translator(path: Path, device: str, precision: str, threads: int, log: Callable[[str], None]):
    from xformer_cli.decode.ct2_engine import CTranslate2Translator
    from xformer_cli.export.ctranslate2 import export_ctranslate2, import_ctranslate2

    gpus = import_ctranslate2().get_cuda_device_count() if device == "auto" else 0
    ct2_device = "cuda" if device.startswith("cuda") or gpus else "cpu"
    compute_type = CT2_COMPUTE_TYPES[precision]
    if path.is_dir():
        return CTranslate2Translator.from_directory(path, device=ct2_device, compute_type=compute_type, threads=threads)
    log(f"exporting {path} for CTranslate2 (a temporary directory, removed once loaded)")
    with tempfile.TemporaryDirectory(prefix="xformer-serve-") as tmp:
        quantization = "int8" if precision == "int8" else None
        exported = export_ctranslate2(path, Path(tmp) / "ct2", quantization=quantization)
        return CTranslate2Translator.from_directory(exported, device=ct2_device, compute_type=compute_type,
                                                    threads=threads)


def checkpoint_languages(path: Path) -> Optional[tuple[str, str]]:
    """data.src_lang and data.tgt_lang of a checkpoint's config (None if it has none)."""
    import torch

    try:  # mmap: the config without reading every weight again
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - an older file format: read it whole
        from xformer_cli.checkpoint import load_checkpoint

        state = load_checkpoint(path)
    data = (state.get("config") or {}).get("data") or {}
    src, tgt = data.get("src_lang"), data.get("tgt_lang")
    return (src, tgt) if isinstance(src, str) and isinstance(tgt, str) else None


def _export_info(path: Path) -> dict:
    try:
        return json.loads((path / "xformer_export.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def export_languages(path: Path) -> Optional[tuple[str, str]]:
    """The language codes ``xformer export`` recorded (exports from before it did: None)."""
    info = _export_info(path)
    src, tgt = info.get("src_lang"), info.get("tgt_lang")
    return (src, tgt) if isinstance(src, str) and isinstance(tgt, str) else None


def _export_weights(path: Path) -> str:
    if not path.is_dir():
        return "float32"
    return _export_info(path).get("quantization") or "float32"


def _model_name(path: Path) -> str:
    """``run/best.pt`` for a checkpoint, the folder's name for an export."""
    path = path.resolve()
    return path.name if path.is_dir() else f"{path.parent.name}/{path.name}"
