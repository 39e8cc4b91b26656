"""Export a checkpoint to a CTranslate2 model directory (``decode/ct2_engine.py`` translates with it).

    from xformer_cli.export.ctranslate2 import export_ctranslate2
    export_ctranslate2("runs/multi30k/best.pt", "runs/multi30k/ct2", quantization="int8")

The exported directory holds what CTranslate2 reads (``model.bin``, ``config.json``,
``shared_vocabulary.json`` or ``source_vocabulary.json`` + ``target_vocabulary.json``),
the sentencepiece model(s) (``spm.model`` when joint, else ``source.spm.model`` and
``target.spm.model``) and ``xformer_export.json`` (decode defaults, language codes, xformer version).

The spec mirrors ``model/transformer.py`` exactly: fused q/k/v for self-attention, query
plus fused k/v for encoder-decoder attention, post- or pre-norm sublayers (pre-norm
stacks keep their final LayerNorm), embeddings times sqrt(d_model), and xformer's own
interleaved sinusoidal table as the position encodings. Greedy outputs therefore equal
``Translator.translate(..., beam_size=1)``; beam search differs in its stopping rule
(see the note on beam search in ``decode/ct2_engine.py``).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from xformer_cli.errors import XformerError
from xformer_cli.export.common import load_for_export, output_directory, special_pieces, write_directory
from xformer_cli.export.format import EXPORT_INFO, JOINT_SPM, MIN_POSITIONS, SOURCE_SPM, TARGET_SPM, piece_list
from xformer_cli.export.shortlist import VMAP_FILE, Shortlist, write_vmap
from xformer_cli.tokenizer import Tokenizer

if TYPE_CHECKING:
    from xformer_cli.config import Config
    from xformer_cli.model.transformer import Transformer

MISSING_CT2 = "CTranslate2 export needs the ctranslate2 package: pip install 'xformer[ctranslate2]'"
LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default; CTranslate2's own default is not the same


def import_ctranslate2() -> Any:
    try:
        import ctranslate2
    except ImportError:
        raise XformerError(MISSING_CT2) from None
    return ctranslate2


# -- export ------------------------------------------------------------------------------

def export_ctranslate2(
    checkpoint: str | Path, output_dir: str | Path, quantization: Optional[str] = None, force: bool = False,
    loaded: Optional[tuple[Transformer, Tokenizer, Config]] = None, shortlist: Optional[Shortlist] = None,
) -> Path:
    """Write ``checkpoint`` as a CTranslate2 model directory at ``output_dir``; returns it.

    An existing non-empty ``output_dir`` is refused unless ``force``. The model is built in
    a temporary sibling directory and renamed into place, so an interrupted export never
    leaves a half-written model where a good one was. ``loaded``: the checkpoint as
    ``load_for_export`` gives it, when the caller has read it already. ``shortlist``: a lexical
    shortlist (``export/shortlist.py``, built with the checkpoint's tokenizer) goes with it.
    """
    import_ctranslate2()
    output = output_directory(output_dir, force, checkpoint)
    model, tokenizer, config = loaded or load_for_export(checkpoint, "CTranslate2")
    spec = _build_spec(model, tokenizer)
    try:
        spec.validate()
        spec.optimize(quantization=quantization)
    except ValueError as exc:  # a bad quantization name, or a spec the weights do not fill
        raise XformerError(f"CTranslate2 export failed: {str(exc).strip().splitlines()[0]}") from None

    def write(staging: Path) -> None:
        spec.save(str(staging))
        _write_extras(staging, tokenizer, config, quantization, model.cfg, shortlist)

    return write_directory(output, write)


def _build_spec(model, tokenizer: Tokenizer):
    """A ``TransformerSpec`` filled with the model's weights and the tokenizer's pieces."""
    from ctranslate2.specs import common_spec, transformer_spec

    cfg = model.cfg
    if cfg.d_model % cfg.n_heads:
        raise XformerError(f"cannot export to CTranslate2: d_model {cfg.d_model} "
                           f"is not divisible by n_heads {cfg.n_heads}")
    activation = {"relu": common_spec.Activation.RELU, "swish": common_spec.Activation.SWISH,
                  "silu": common_spec.Activation.SWISH, "gelu": common_spec.Activation.GELU}[cfg.activation]
    spec = transformer_spec.TransformerSpec.from_config(
        (cfg.encoder_layers, cfg.decoder_layers), cfg.n_heads, pre_norm=cfg.pre_norm, activation=activation
    )
    positions = _position_table(cfg)
    _set_encoder(spec.encoder, model, positions)
    _set_decoder(spec.decoder, model, positions)
    special = special_pieces(tokenizer, "cannot export to CTranslate2", bos_id=cfg.bos_id)
    spec.config.unk_token = special["unk"]
    spec.config.bos_token = special["bos"]
    spec.config.eos_token = special["eos"]
    spec.config.decoder_start_token = special["bos"]  # the target starts with model.bos_id (2; Marian's pad, 0)
    spec.config.add_source_eos = True  # xformer's source ends with eos (id 3)
    spec.config.layer_norm_epsilon = LAYER_NORM_EPS
    spec.register_source_vocabulary(piece_list(tokenizer.src))
    spec.register_target_vocabulary(piece_list(tokenizer.tgt))
    return spec


def _position_table(cfg):
    from xformer_cli.model.transformer import sinusoidal_positions

    return sinusoidal_positions(max(cfg.max_positions, MIN_POSITIONS), cfg.d_model).numpy()


def _np(tensor):
    return tensor.detach().float().cpu().numpy().copy()


def _set_linear(spec, linear) -> None:
    spec.weight = _np(linear.weight)
    if linear.bias is not None:
        spec.bias = _np(linear.bias)


def _set_layer_norm(spec, norm) -> None:
    spec.gamma = _np(norm.weight)
    spec.beta = _np(norm.bias)


def _set_self_attention(spec, attn, norm) -> None:
    """linear[0] = fused q, k, v (xformer's kv_proj already holds k then v); linear[1] = out."""
    import numpy as np

    spec.linear[0].weight = np.concatenate([_np(attn.q_proj.weight), _np(attn.kv_proj.weight)])
    spec.linear[0].bias = np.concatenate([_np(attn.q_proj.bias), _np(attn.kv_proj.bias)])
    _set_linear(spec.linear[-1], attn.out_proj)
    _set_layer_norm(spec.layer_norm, norm)


def _set_cross_attention(spec, attn, norm) -> None:
    """linear[0] = query, linear[1] = fused k, v, linear[2] = out."""
    _set_linear(spec.linear[0], attn.q_proj)
    _set_linear(spec.linear[1], attn.kv_proj)
    _set_linear(spec.linear[-1], attn.out_proj)
    _set_layer_norm(spec.layer_norm, norm)


def _set_ffn(spec, ffn, norm) -> None:
    _set_linear(spec.linear_0, ffn.w1)
    _set_linear(spec.linear_1, ffn.w2)
    _set_layer_norm(spec.layer_norm, norm)


def _set_inputs(spec, embeddings_spec, embed, positions) -> None:
    """Token embeddings times sqrt(d_model) (xformer's Embedding) plus xformer's own table."""
    embeddings_spec.weight = _np(embed.tokens.weight)
    spec.scale_embeddings = embed.scale != 1.0
    spec.position_encodings.encodings = positions


def _set_encoder(spec, model, positions) -> None:
    _set_inputs(spec, spec.embeddings[0], model.src_embed, positions)
    for layer_spec, layer in zip(spec.layer, model.encoder_layers):
        _set_self_attention(layer_spec.self_attention, layer.self_attn, layer.sub_attn.norm)
        _set_ffn(layer_spec.ffn, layer.ffn, layer.sub_ffn.norm)
    if model.cfg.pre_norm:  # post-norm stacks have no final LayerNorm, nor does the spec then
        _set_layer_norm(spec.layer_norm, model.encoder_norm)


def _set_decoder(spec, model, positions) -> None:
    _set_inputs(spec, spec.embeddings, model.tgt_embed, positions)
    spec.projection.weight = _np(model.generator.weight)
    bias = model.output_bias()  # Marian's logits bias, -inf on pieces a restricted layer does not score
    if bias is not None:  # else no bias, like xformer's generator
        spec.projection.bias = _np(bias)
    for layer_spec, layer in zip(spec.layer, model.decoder_layers):
        _set_self_attention(layer_spec.self_attention, layer.self_attn, layer.sub_self.norm)
        _set_cross_attention(layer_spec.attention, layer.cross_attn, layer.sub_cross.norm)
        _set_ffn(layer_spec.ffn, layer.ffn, layer.sub_ffn.norm)
    if model.cfg.pre_norm:
        _set_layer_norm(spec.layer_norm, model.decoder_norm)


def _write_extras(directory: Path, tokenizer: Tokenizer, config, quantization: Optional[str], model_cfg,
                  shortlist: Optional[Shortlist] = None) -> None:
    """The sentencepiece model(s), the shortlist's ``vmap.txt`` and ``xformer_export.json`` next
    to CTranslate2's files."""
    from xformer_cli.version import __version__

    languages = config.data.languages()
    if tokenizer.joint:
        (directory / JOINT_SPM).write_bytes(tokenizer.src_model_bytes)
    else:
        (directory / SOURCE_SPM).write_bytes(tokenizer.src_model_bytes)
        (directory / TARGET_SPM).write_bytes(tokenizer.tgt_model_bytes)
    info = {
        "format": "xformer-ctranslate2",
        "xformer_version": __version__,
        "joint_vocab": tokenizer.joint,
        "src_lang": languages.pairs[0][0],  # the first direction (exports before multilingual models: the only one)
        "tgt_lang": languages.pairs[0][1],
        "languages": languages.to_dict(),  # every direction and its tag: what translate and serve offer
        "quantization": quantization,
        "max_positions": max(model_cfg.max_positions, MIN_POSITIONS),
        "decode": asdict(config.decode_settings()),
        "bos_id": model_cfg.bos_id,  # the start token, never emitted
    }
    if tokenizer.vocab is not None:  # pieces numbered by a vocabulary (an imported MarianMT model)
        info["vocabularies"] = {"vocab": tokenizer.vocab, "tgt_vocab": tokenizer.tgt_vocab}
    if shortlist is not None:  # what tells the engine to use it
        write_vmap(directory / VMAP_FILE, shortlist, tokenizer)
        info["shortlist"] = {**asdict(shortlist.settings), "pairs": shortlist.pairs, "file": VMAP_FILE}
    (directory / EXPORT_INFO).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
