"""Reading a MarianMT model directory (or a Hub id) for ``importers/marian.py``: where it is,
its config checked against what xformer can express, its weights, its vocabulary.

Every refusal is one ``XformerError`` line naming the file and the key (or tensor).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from xformer_cli.errors import XformerError

# Marian's FFN activations xformer's FeedForward computes alike (transformers' ACT2FN names).
ACTIVATIONS = {"relu": "relu", "swish": "swish", "silu": "swish", "gelu": "gelu"}
# Pegasus is Marian with pre-norm layers and a LayerNorm after each stack: what `xformer export`
# writes for a pre-norm model (with MarianTokenizer's files beside it).
MODEL_TYPES = ("marian", "pegasus")
HUB_FILES = ["config.json", "generation_config.json", "*.safetensors", "pytorch_model.bin", "*.spm",
             "*vocab.json", "tokenizer_config.json"]


def resolve_source(source: str) -> Path:
    """The local directory of ``source``: itself, or a Hub id downloaded to the Hub cache."""
    path = Path(source)
    if path.is_dir():
        return path
    if path.exists():
        raise XformerError(f"{source} is not a directory (a MarianMT model directory or a Hub id is expected)")
    if source.count("/") != 1 or source.startswith((".", "/", "~")):
        raise XformerError(f"{source}: no such directory "
                           "(a MarianMT model directory or a Hub id such as Helsinki-NLP/opus-mt-en-de)")
    return _download(source)


def _download(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise XformerError(f"{repo_id}: downloading from the Hub needs huggingface_hub: "
                           "pip install 'xformer[hf]'") from None
    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_FILES))
    except Exception as exc:  # offline, unknown repo, gated: the hub raises many kinds
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:120]
        raise XformerError(
            f"cannot download {repo_id} from the Hugging Face Hub ({reason}); where there is internet run "
            f"`huggingface-cli download {repo_id} --local-dir DIR`, "
            "copy DIR here and run `xformer import DIR`") from None


def read_json(path: Path) -> Any:
    if not path.is_file():
        raise XformerError(f"{path} not found (a MarianMT model directory has config.json, model.safetensors or "
                           "pytorch_model.bin, source.spm, target.spm and vocab.json)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise XformerError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise XformerError(f"{path}: must hold a JSON object ({{\"key\": value, ...}}), not {type(data).__name__}")
    return data


# The sizes the model is built from: whole numbers above 0 (a string or a float broke the build).
SIZE_KEYS = ("d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads", "encoder_ffn_dim")
OPTIONAL_SIZE_KEYS = ("decoder_attention_heads", "decoder_ffn_dim", "vocab_size", "decoder_vocab_size",
                      "max_position_embeddings")
RATE_KEYS = ("dropout", "attention_dropout", "activation_dropout")


def _check_types(config: dict, where: Path) -> None:
    for key in (*SIZE_KEYS, *OPTIONAL_SIZE_KEYS):
        value = config.get(key)
        if value is None and key in SIZE_KEYS:
            raise XformerError(f"{where}: {key} is missing (the model's sizes: {', '.join(SIZE_KEYS)})")
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise XformerError(f"{where}: {key} must be a whole number above 0, not {json.dumps(value)}")
    for key in RATE_KEYS:
        value = config.get(key, 0.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise XformerError(f"{where}: {key} must be a number in [0, 1), not {json.dumps(value)}")


def check_config(config: dict, where: Path) -> None:
    """Refuse, naming the key, what xformer's Transformer cannot compute as MarianMT does."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in MODEL_TYPES:
        raise XformerError(f"{where}: model_type {model_type!r} is not 'marian'; only MarianMT (OPUS-MT) models "
                           "(and the Pegasus directories `xformer export` writes for pre-norm models) can be imported")
    activation = config.get("activation_function", "gelu")
    if activation not in ACTIVATIONS:
        raise XformerError(f"{where}: activation_function {activation!r} is not supported "
                           f"(only {', '.join(ACTIVATIONS)})")
    refused = {"add_bias_logits": True, "normalize_before": True, "normalize_embedding": True,
               "layernorm_embedding": True, "static_position_embeddings": False, "add_final_layer_norm": True}
    for key, bad in refused.items():
        if config.get(key) is bad:
            raise XformerError(f"{where}: {key}: {json.dumps(bad)} cannot be imported (MarianMT's transformers "
                               "model has no such part; xformer maps only what it computes)")
    for encoder_key, decoder_key in (("encoder_attention_heads", "decoder_attention_heads"),
                                     ("encoder_ffn_dim", "decoder_ffn_dim")):
        if config.get(encoder_key) != config.get(decoder_key):
            raise XformerError(f"{where}: {decoder_key} {config.get(decoder_key)} differs from {encoder_key} "
                               f"{config.get(encoder_key)}; xformer has one value for both stacks")
    _check_types(config, where)
    d_model, heads = config["d_model"], config["encoder_attention_heads"]
    if d_model % 2 or d_model % heads:
        raise XformerError(f"{where}: d_model {d_model} must be even and divisible by encoder_attention_heads {heads}")


def read_weights(directory: Path) -> tuple[dict, Path]:
    """The tensors of model.safetensors, else of pytorch_model.bin (read with weights_only)."""
    safetensors_path, bin_path = directory / "model.safetensors", directory / "pytorch_model.bin"
    if safetensors_path.is_file():
        try:
            from safetensors.torch import load_file
        except ImportError:
            raise XformerError(f"{safetensors_path}: reading it needs safetensors: pip install 'xformer[hf]'") from None
        try:
            return load_file(str(safetensors_path)), safetensors_path
        except Exception as exc:  # a truncated or foreign file
            raise XformerError(f"{safetensors_path}: not a readable safetensors file ({str(exc)[:120]})") from None
    if bin_path.is_file():
        import torch

        try:
            weights = torch.load(bin_path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise XformerError(f"{bin_path}: not a readable weights file ({str(exc).strip()[:120]})") from None
        if not isinstance(weights, dict):
            raise XformerError(f"{bin_path}: holds no state dict")
        return weights, bin_path
    raise XformerError(f"{directory}: no model.safetensors or pytorch_model.bin")


def read_vocabulary(path: Path, size: int, size_key: str) -> list[str]:
    """vocab.json (piece -> id) as the list of pieces by id; the ids must be 0 .. size - 1."""
    vocab = read_json(path)
    if not isinstance(vocab, dict) or not all(isinstance(i, int) for i in vocab.values()):
        raise XformerError(f"{path}: expected a mapping of piece to id")
    pieces: list = [None] * size
    for piece, i in vocab.items():
        if not 0 <= i < size or pieces[i] is not None:
            raise XformerError(f"{path}: id {i} of {piece!r} is out of range or repeated "
                               f"(config.json {size_key} is {size})")
        pieces[i] = piece
    if None in pieces:
        raise XformerError(f"{path}: {pieces.count(None)} of the {size} ids of config.json {size_key} have no piece")
    return pieces


def read_bytes(path: Path) -> bytes:
    if not path.is_file():
        raise XformerError(f"{path} not found (MarianMT keeps its sentencepiece models in source.spm and target.spm)")
    return path.read_bytes()
