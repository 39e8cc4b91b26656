"""Export a checkpoint as a Hugging Face ``transformers`` MarianMT model directory (a
pre-norm model as a Pegasus one: the same layers, normalised before each sub-layer).

    from xformer_cli.export.huggingface import export_huggingface
    export_huggingface("runs/multi30k/best.pt", "runs/multi30k/hf")

    from transformers import AutoModelForSeq2SeqLM, MarianTokenizer
    model = AutoModelForSeq2SeqLM.from_pretrained("runs/multi30k/hf")  # MarianMTModel (pre-norm: Pegasus)
    tokenizer = MarianTokenizer.from_pretrained("runs/multi30k/hf")
    batch = tokenizer(["A man rides a bike."], return_tensors="pt", padding=True)
    tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True)

The directory holds ``config.json`` and ``model.safetensors`` (the model),
``generation_config.json`` (xformer's decode settings in Hugging Face's terms),
``source.spm``, ``target.spm``, ``vocab.json`` (and ``target_vocab.json`` for separate
vocabularies), ``tokenizer_config.json`` (what ``MarianTokenizer`` reads; every piece keeps
xformer's id) and ``xformer_export.json`` (xformer's decode settings and version).

How xformer's Transformer maps onto Marian's (``transformers/models/marian``):

- The sinusoidal table. Marian builds its own when it loads a model (the weights file has
  none) and puts every sine first and every cosine second, where xformer (like the paper)
  interleaves them: xformer's column 2i is Marian's column i and xformer's 2i+1 is Marian's
  d/2 + i. So the export permutes the hidden dimension the same way everywhere it appears:
  the columns of the embeddings (and of the tied output matrix), the rows and biases of
  every projection that writes to the residual stream (attention output, second FFN
  layer), the columns of every projection that reads from it (q, k, v, first FFN layer),
  and the LayerNorm weights and biases (a LayerNorm over permuted features is the permuted
  LayerNorm). The permuted model computes exactly what xformer's does; only its residual
  stream lists the same features in another order.
- xformer's fused ``kv_proj`` holds k then v: it is split into ``k_proj`` and ``v_proj``.
- Embeddings are scaled by sqrt(d_model) unless ``model.scale_embedding`` is false
  (``scale_embedding``); LayerNorm eps is 1e-5 on both sides (torch's default); the
  activation is ``model.activation`` (relu, swish, gelu); ``final_logits_bias`` is the
  model's logits bias (``model.final_logits_bias``, an imported MarianMT model's) with -inf
  on the pieces a restricted output layer does not score (``model.restrict_output``), else zeros.
- Vocabularies: one source/target embedding matrix is Marian's shared embedding
  (``share_encoder_decoder_embeddings``; with untied output also written as the encoder's and
  decoder's, which transformers then reads); separate ones give separate encoder and decoder
  embeddings, and ``tie_word_embeddings`` says whether the output matrix is the decoder
  embedding, as in xformer. A tokenizer with one vocabulary list over two sentencepiece
  models (an imported OPUS-MT model) writes that list as vocab.json.
- A multilingual model's tags (``>>fra<<``) are pieces of the vocabulary, so vocab.json holds
  them and ``MarianTokenizer`` reads ``">>fra<< A man ..."`` as xformer does: the tag's id,
  then sentencepiece's pieces of the rest (``supported_language_codes`` lists them).
  tokenizer_config.json names the languages as OPUS-MT does ("mul" for several);
  xformer_export.json keeps every direction, which ``xformer import`` reads back.
- Ids: pad 0, unk 1, eos 3. The decoder starts with ``model.bos_id`` (``decoder_start_token_id``):
  bos 2 for models xformer trains, pad 0 for imported OPUS-MT models, as Marian itself;
  ``MarianTokenizer`` appends eos to the source as xformer does.

Pre-norm models (``model.pre_norm: true``, the multilingual config's). Marian's layers are
post-norm and it has no final LayerNorm; Pegasus (``PegasusForConditionalGeneration``) is
Marian's model with pre-norm layers and a LayerNorm after each stack, with the same sinusoidal
table, embedding scaling, ``final_logits_bias`` and tensor names: the export writes
``"model_type": "pegasus"``, the two final LayerNorms (``model.encoder.layer_norm``,
``model.decoder.layer_norm``) and the sinusoid tables (``embed_positions``: Pegasus stores
them, where Marian rebuilds its own), and the same tokenizer files (tokenizer_config.json names
``MarianTokenizer``, so ``AutoTokenizer`` reads them; load the model with
``AutoModelForSeq2SeqLM``). Pegasus has one embedding matrix for both stacks: a pre-norm model
with separate source and target embeddings is refused.

Refused, with one line saying why: pre-norm models with separate embeddings, special pieces
that differ between the source and target tokenizers (``MarianTokenizer`` has one name per
role), and model options this exporter does not know.

Decoding. Greedy search (``num_beams=1``) gives xformer's tokens (1000 of 1000 Multi30k
test lines; BENCHMARKS.md), and ``batch_decode(..., skip_special_tokens=True)`` its text,
except that MarianTokenizer strips the spaces around a line (sentencepiece, and so xformer,
keeps the space of a final lone "▁" piece). Beam search differs in
two ways that no generation setting removes: Hugging Face divides a finished hypothesis's
log-probability by |Y| ** length_penalty where xformer uses GNMT's ((5 + |Y|) / 6) ** alpha
(|Y| counts eos in both), and at the length limit Hugging Face forces eos with
log-probability 0 where xformer keeps eos's own. ``generation_config.json`` sets
``early_stopping="never"`` (stop once no live beam can beat the finished ones, bounded at the
maximum length: xformer's rule) and ``length_penalty`` = ``HF_LENGTH_PENALTY_SCALE`` x alpha
(see below). xformer's length limit, max_len_a * source length + max_len_b pieces before
eos (the source length counts its eos), depends on each sentence; Hugging Face has one
limit per ``generate`` call, so ``max_new_tokens`` holds the limit of the longest source
xformer accepts (decode.max_input_len pieces), + 1 for eos. Pass
``max_new_tokens=xformer_max_new_tokens(source_length, ...)`` per call (or per batch of equal
source lengths, as ``scripts/compare_huggingface.py`` does) for xformer's exact limit.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xformer_cli.errors import XformerError
from xformer_cli.export.common import load_for_export, output_directory, special_pieces, write_directory
from xformer_cli.export.format import EXPORT_INFO, MIN_POSITIONS
from xformer_cli.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer

if TYPE_CHECKING:  # torch loads when an export runs, not when the CLI imports this module
    from torch import Tensor, nn

    from xformer_cli.model.config import ModelConfig
    from xformer_cli.model.transformer import FeedForward, MultiHeadAttention, Transformer

MISSING_HF = "Hugging Face export needs transformers and safetensors: pip install 'xformer[hf]'"
# Hugging Face's length_penalty for xformer's GNMT alpha. No setting makes |Y| ** lp equal
# ((5 + |Y|) / 6) ** alpha; ranking hypotheses of nearby lengths alike needs equal slopes in
# log-length, alpha / (5 + |Y|) = lp / |Y|, i.e. lp = alpha * |Y| / (5 + |Y|): 0.75 alpha at
# |Y| = 15 pieces (eos included), about a Multi30k translation (14.2 on test2016). On test2016
# this scale came closest to xformer's beam, in BLEU and in identical lines, and alpha itself
# gave longer outputs (docs/benchmarks/import-export.md, "Hugging Face export"). Corpora of
# longer sentences want a larger scale.
HF_LENGTH_PENALTY_SCALE = 0.75


def _import_hf() -> tuple[Any, Any]:
    try:
        import safetensors.torch
        import transformers
    except ImportError:
        raise XformerError(MISSING_HF) from None
    return transformers, safetensors.torch


def xformer_max_new_tokens(source_length: int, max_len_a: float, max_len_b: int) -> int:
    """``max_new_tokens`` for a source of ``source_length`` ids (eos included): xformer's
    limit (a * length + b pieces, computed in float32 as its search does, at least 1) + eos."""
    import torch

    limit = int((max_len_a * torch.tensor(float(source_length)) + max_len_b).long().clamp(min=1))
    return limit + 1


# -- export ------------------------------------------------------------------------------

def export_huggingface(checkpoint: str | Path, output_dir: str | Path, force: bool = False) -> Path:
    """Write ``checkpoint`` as a Hugging Face MarianMT directory at ``output_dir``; returns it.

    An existing non-empty ``output_dir`` is refused unless ``force``. The files are written
    to a temporary sibling directory that is then renamed into place, so an interrupted
    export never leaves a half-written model where a good one was.
    """
    transformers, st = _import_hf()
    output = output_directory(output_dir, force, checkpoint)
    model, tokenizer, config = load_for_export(checkpoint, "Hugging Face")
    _check_expressible(model, checkpoint)
    specials = special_pieces(tokenizer, f"{checkpoint}: cannot export to Hugging Face",
                              "; MarianTokenizer has one {role} token", bos_id=model.cfg.bos_id)
    decode = config.decode_settings()
    marian_config = (_pegasus_config if model.cfg.pre_norm else _marian_config)(transformers, model)
    generation_config = _generation_config(transformers, decode, model.cfg.bos_id)
    weights = marian_state_dict(model)

    def write(staging: Path) -> None:
        marian_config.save_pretrained(staging)
        generation_config.save_pretrained(staging)
        _write_weights(staging / "model.safetensors", st.save(weights, metadata={"format": "pt"}))
        _write_tokenizer(staging, tokenizer, specials, config, decode)
        _write_info(staging, tokenizer, decode, generation_config, config.data.languages())

    return write_directory(output, write)


def _check_expressible(model, checkpoint) -> None:
    cfg = model.cfg
    where = f"{checkpoint}: cannot export to Hugging Face"
    if cfg.pre_norm and model.src_embed.tokens is not model.tgt_embed.tokens:
        raise XformerError(f"{where}: pre-norm model (model.pre_norm: true) with separate source and target "
                           "embeddings; it exports as Pegasus, whose stacks share one embedding matrix "
                           "(tokenizer.joint and model.tie_embeddings: true)")
    if cfg.d_model % 2:
        raise XformerError(f"{where}: d_model {cfg.d_model} is odd; Marian's sinusoidal table needs an even d_model")
    if cfg.d_model % cfg.n_heads:
        raise XformerError(f"{where}: d_model {cfg.d_model} is not divisible by n_heads {cfg.n_heads}")


def _marian_config(transformers, model):
    cfg = model.cfg
    shared = model.src_embed.tokens is model.tgt_embed.tokens
    return transformers.MarianConfig(
        vocab_size=model.src_vocab,
        decoder_vocab_size=model.tgt_vocab,
        share_encoder_decoder_embeddings=shared,
        tie_word_embeddings=cfg.tie_embeddings,
        d_model=cfg.d_model,
        encoder_layers=cfg.encoder_layers,
        decoder_layers=cfg.decoder_layers,
        encoder_attention_heads=cfg.n_heads,
        decoder_attention_heads=cfg.n_heads,
        encoder_ffn_dim=cfg.d_ff,
        decoder_ffn_dim=cfg.d_ff,
        activation_function=cfg.activation,
        dropout=cfg.dropout,
        attention_dropout=cfg.attention_dropout,
        activation_dropout=cfg.activation_dropout,
        max_position_embeddings=hf_positions(cfg),
        scale_embedding=cfg.scale_embedding,
        pad_token_id=PAD_ID,
        bos_token_id=cfg.bos_id,
        eos_token_id=EOS_ID,
        forced_eos_token_id=EOS_ID,
        decoder_start_token_id=cfg.bos_id,
        architectures=["MarianMTModel"],
        dtype="float32",
    )


def hf_positions(cfg: Any) -> int:
    """max_position_embeddings: the rows of the sinusoid tables."""
    return max(cfg.max_positions, MIN_POSITIONS)


def _pegasus_config(transformers, model):
    """Marian's settings under Pegasus's names: the pre-norm model with final LayerNorms."""
    marian = _marian_config(transformers, model).to_dict()
    keep = set(transformers.PegasusConfig().to_dict()) - {"model_type", "transformers_version"}
    settings = {k: v for k, v in marian.items() if k in keep}
    return transformers.PegasusConfig(**{**settings, "architectures": ["PegasusForConditionalGeneration"]})


def _generation_config(transformers, decode, bos_id: int = BOS_ID):
    max_source = (decode.max_input_len or 1024) + 1  # + eos
    return transformers.GenerationConfig(
        decoder_start_token_id=bos_id,
        bos_token_id=bos_id,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        forced_eos_token_id=EOS_ID,  # at the length limit only eos may follow (xformer's rule)
        suppress_tokens=sorted({PAD_ID, bos_id}),  # xformer never emits pad or its start token
        min_new_tokens=decode.min_len,  # pieces before eos at least, as xformer counts them
        max_new_tokens=xformer_max_new_tokens(max_source, decode.max_len_a, decode.max_len_b),
        num_beams=decode.beam_size,
        do_sample=False,
        # beam search's settings; transformers refuses them with num_beams 1 (decode.beam_size 1)
        **(dict(length_penalty=round(HF_LENGTH_PENALTY_SCALE * decode.length_penalty, 4), early_stopping="never")
           if decode.beam_size > 1 else {}),
    )


def _write_tokenizer(directory: Path, tokenizer: Tokenizer, specials: dict[str, str], config, decode) -> None:
    """What MarianTokenizer reads: both sentencepiece models (the joint one twice) and
    vocab.json mapping every piece to xformer's id (target_vocab.json for separate ones)."""
    (directory / "source.spm").write_bytes(tokenizer.src_model_bytes)
    (directory / "target.spm").write_bytes(tokenizer.tgt_model_bytes or tokenizer.src_model_bytes)
    _write_json(directory / "vocab.json", _vocabulary(tokenizer.src))
    if not tokenizer.one_id_space:
        _write_json(directory / "target_vocab.json", _vocabulary(tokenizer.tgt))
    languages = config.data.languages()
    sources, targets = languages.sources, languages.targets
    _write_json(directory / "tokenizer_config.json", {
        "tokenizer_class": "MarianTokenizer",
        # OPUS-MT's names: a language code, or "mul" for several (the tags say which: >>fra<<)
        "source_lang": sources[0] if len(sources) == 1 else "mul",
        "target_lang": targets[0] if len(targets) == 1 else "mul",
        "unk_token": specials["unk"],
        "bos_token": specials["bos"],  # never added to the source; marks it special for decoding
        "eos_token": specials["eos"],
        "pad_token": specials["pad"],
        "separate_vocabs": not tokenizer.one_id_space,
        # With truncation=True: decode.max_input_len pieces + eos, xformer's own cut.
        "model_max_length": (decode.max_input_len or 1024) + 1,
        "clean_up_tokenization_spaces": False,
        "sp_model_kwargs": {},
    })


def _vocabulary(sp) -> dict[str, int]:
    return {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}


def _write_info(directory: Path, tokenizer: Tokenizer, decode, generation_config, languages) -> None:
    from xformer_cli.version import __version__

    _write_json(directory / EXPORT_INFO, {
        "format": "xformer-huggingface",
        "xformer_version": __version__,
        "joint_vocab": tokenizer.joint,
        "languages": languages.to_dict(),  # every direction; a tag leads the source: ">>fra<< A man ..."
        "decode": asdict(decode),
        "length_penalty_note": (
            f"xformer ranks beams by logprob / ((5 + |Y|) / 6) ** {decode.length_penalty} (GNMT); Hugging Face by "
            f"logprob / |Y| ** length_penalty, set to {generation_config.length_penalty} "
            f"({HF_LENGTH_PENALTY_SCALE} x alpha)"),
        "max_length_note": (
            f"xformer allows int({decode.max_len_a} * source ids (eos included) + {decode.max_len_b}) pieces, "
            "then eos; "
            "generation_config's max_new_tokens is that limit + 1 for the longest source kept "
            "(decode.max_input_len pieces); pass max_new_tokens per call for a shorter one"),
    })


def _write_weights(path: Path, data: bytes) -> None:
    """Python's own write, so a full disk is an OSError (ENOSPC) that ``disk_full`` knows."""
    with open(path, "wb") as handle:
        handle.write(data)


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# -- weights -------------------------------------------------------------------------------

def hidden_permutation(d_model: int) -> Tensor:
    """Marian's hidden index -> xformer's: sines (xformer's even columns) first, then cosines."""
    import torch

    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def marian_state_dict(model: Transformer) -> dict[str, Tensor]:
    """xformer's weights under MarianMTModel's names, the hidden dimension permuted to
    Marian's order (see the module docstring); tied weights are written once, as
    ``save_pretrained`` writes them."""
    import torch

    weights = _MarianWeights(model.cfg)
    for i, layer in enumerate(model.encoder_layers):
        p = f"model.encoder.layers.{i}"
        weights.attention(f"{p}.self_attn", layer.self_attn)
        weights.layer_norm(f"{p}.self_attn_layer_norm", layer.sub_attn.norm)
        weights.ffn(p, layer.ffn, layer.sub_ffn.norm)
    for i, layer in enumerate(model.decoder_layers):
        p = f"model.decoder.layers.{i}"
        weights.attention(f"{p}.self_attn", layer.self_attn)
        weights.layer_norm(f"{p}.self_attn_layer_norm", layer.sub_self.norm)
        weights.attention(f"{p}.encoder_attn", layer.cross_attn)
        weights.layer_norm(f"{p}.encoder_attn_layer_norm", layer.sub_cross.norm)
        weights.ffn(p, layer.ffn, layer.sub_ffn.norm)
    if model.cfg.pre_norm:  # Pegasus: a LayerNorm after each stack
        weights.layer_norm("model.encoder.layer_norm", model.encoder_norm)
        weights.layer_norm("model.decoder.layer_norm", model.decoder_norm)
        weights.positions(hf_positions(model.cfg))
    weights.embeddings(model)
    bias = model.output_bias()  # Marian's logits bias, -inf on pieces a restricted layer does not score
    bias = torch.zeros(model.tgt_vocab) if bias is None else bias
    weights.out["final_logits_bias"] = _float32(bias).reshape(1, -1)  # a bias-free generator: zeros
    return weights.out


def _float32(x: Tensor) -> Tensor:
    """A float32 copy of its own (tied weights must not share storage in the file)."""
    import torch

    return x.detach().to(torch.float32, copy=True).contiguous()


class _MarianWeights:
    """Collects xformer's tensors in ``out`` under Marian's names, hidden dimension permuted."""

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg
        self.perm = hidden_permutation(cfg.d_model)
        self.out: dict[str, Any] = {}

    def reads(self, weight: Tensor) -> Tensor:  # a projection that reads the residual stream: permute its input columns
        return _float32(weight[:, self.perm])

    def writes(self, weight: Tensor) -> Tensor:  # one that writes it: permute its output rows
        return _float32(weight[self.perm])

    def bias(self, linear: nn.Linear, rows: int, permuted: bool = False) -> Tensor:
        if linear.bias is None:
            import torch

            return torch.zeros(rows)
        return _float32(linear.bias[self.perm] if permuted else linear.bias)

    def layer_norm(self, prefix: str, norm: nn.LayerNorm) -> None:
        self.out[f"{prefix}.weight"] = _float32(norm.weight[self.perm])
        self.out[f"{prefix}.bias"] = _float32(norm.bias[self.perm])

    def attention(self, prefix: str, attn: MultiHeadAttention) -> None:
        out, d = self.out, self.cfg.d_model
        out[f"{prefix}.q_proj.weight"], out[f"{prefix}.q_proj.bias"] = (
            self.reads(attn.q_proj.weight), self.bias(attn.q_proj, d))
        kv_bias = self.bias(attn.kv_proj, 2 * d)
        out[f"{prefix}.k_proj.weight"], out[f"{prefix}.k_proj.bias"] = (
            self.reads(attn.kv_proj.weight[:d]), _float32(kv_bias[:d]))
        out[f"{prefix}.v_proj.weight"], out[f"{prefix}.v_proj.bias"] = (
            self.reads(attn.kv_proj.weight[d:]), _float32(kv_bias[d:]))
        out[f"{prefix}.out_proj.weight"] = self.writes(attn.out_proj.weight)
        out[f"{prefix}.out_proj.bias"] = self.bias(attn.out_proj, d, permuted=True)

    def ffn(self, prefix: str, ffn_module: FeedForward, norm: nn.LayerNorm) -> None:
        out = self.out
        out[f"{prefix}.fc1.weight"], out[f"{prefix}.fc1.bias"] = (
            self.reads(ffn_module.w1.weight), self.bias(ffn_module.w1, self.cfg.d_ff))
        out[f"{prefix}.fc2.weight"] = self.writes(ffn_module.w2.weight)
        out[f"{prefix}.fc2.bias"] = self.bias(ffn_module.w2, self.cfg.d_model, permuted=True)
        self.layer_norm(f"{prefix}.final_layer_norm", norm)

    def positions(self, rows: int) -> None:
        """The sinusoid tables, as xformer computes them (sines, then cosines: Marian's order).
        Pegasus loads them from the file and reports them as newly initialised when missing;
        Marian rebuilds its own and ignores them, so only a pre-norm export writes them."""
        from xformer_cli.model.transformer import sinusoidal_positions

        table = sinusoidal_positions(rows, self.cfg.d_model)
        self.out["model.encoder.embed_positions.weight"] = self.reads(table)
        self.out["model.decoder.embed_positions.weight"] = self.reads(table)  # a copy: no shared storage

    def embeddings(self, model: Transformer) -> None:
        src_embedding, tgt_embedding = model.src_embed.tokens.weight, model.tgt_embed.tokens.weight
        shared = model.src_embed.tokens is model.tgt_embed.tokens
        if shared and self.cfg.tie_embeddings:  # one matrix: embeddings and output
            self.out["model.shared.weight"] = self.reads(src_embedding)
        else:
            if shared:  # transformers ties the stacks to model.shared only with tied output; both read it
                self.out["model.shared.weight"] = self.reads(src_embedding)
            self.out["model.encoder.embed_tokens.weight"] = self.reads(src_embedding)
            self.out["model.decoder.embed_tokens.weight"] = self.reads(tgt_embedding)
            if not self.cfg.tie_embeddings:
                self.out["lm_head.weight"] = self.reads(model.generator.weight)
