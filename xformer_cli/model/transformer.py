"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

Section numbers in the comments refer to the paper. The file holds the whole
model and nothing else: search lives in ``decode/search.py``, the loss in
``train/loss.py``.

Shapes: B batch, S source length, T target length, D d_model, H heads.
Masks are boolean with True meaning "may attend" (the convention of
``torch.nn.functional.scaled_dot_product_attention``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# ModelConfig lives apart (torch-free, for config.py) and is re-exported here, beside the model it shapes.
from xformer_cli.model.config import ACTIVATION_NAMES, ModelConfig
from xformer_cli.model.dropout import Dropout
from xformer_cli.model.linear import (Linear, cpu_bf16_training, cuda_code_path, padded_bf16_block,
                                      stacked_half_product)


# -- 3.5 Positional encoding ---------------------------------------------------------

def sinusoidal_positions(length: int, d_model: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d))."""
    position = torch.arange(length, dtype=torch.float32).unsqueeze(1)
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    table = torch.zeros(length, d_model)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq)
    return table


class Embedding(nn.Module):
    """Token embedding times sqrt(d_model) plus sinusoidal position, then dropout (3.4, 3.5, 5.4)."""

    def __init__(self, tokens: nn.Embedding, d_model: int, max_positions: int, dropout: float, scale: bool = True):
        super().__init__()
        self.tokens = tokens
        self.scale = math.sqrt(d_model) if scale else 1.0
        self.register_buffer("positions", sinusoidal_positions(max_positions, d_model), persistent=False)
        self.dropout = Dropout(dropout)

    def forward(self, ids: Tensor, offset: int = 0, positions: Optional[Tensor] = None) -> Tensor:
        """``positions`` (B, L): each token's own position (packed rows restart it at every
        sentence; always below L); None: offset, offset + 1, ... for every row."""
        length = offset + ids.size(1)
        if length > self.positions.size(0):  # grow the table rather than fail on long inputs
            self.positions = sinusoidal_positions(2 * length, self.positions.size(1)).to(self.positions)
        where = self.positions[offset:length] if positions is None else self.positions[positions]
        x = self.tokens(ids) * self.scale + where
        return self.dropout(x)


# -- Packed rows (training only; not in the paper) --------------------------------------

@dataclass
class Packing:
    """Several sentence pairs back to back in each row (``data/packing.py``): segment ids
    number the pairs of a row from 1 (0 = padding); positions restart at 0 for each pair."""

    src_segments: Tensor  # (B, S)
    tgt_segments: Tensor  # (B, T)
    src_positions: Tensor  # (B, S)
    tgt_positions: Tensor  # (B, T)

    def masks(self) -> tuple[Tensor, Tensor, Tensor]:
        """(encoder self, decoder self, encoder-decoder) attention masks, (B, 1, Lq, Lk):
        a token sees only its own pair (and, in the decoder, only earlier positions)."""
        src, tgt = self.src_segments, self.tgt_segments
        causal = torch.ones(tgt.size(1), tgt.size(1), dtype=torch.bool, device=tgt.device).tril()
        return _same_pair(src, src), _same_pair(tgt, tgt) & causal, _same_pair(tgt, src)

    def to(self, device: torch.device, non_blocking: bool = False) -> "Packing":
        return Packing(*(t.to(device, non_blocking=non_blocking) for t in
                         (self.src_segments, self.tgt_segments, self.src_positions, self.tgt_positions)))


def _same_pair(query: Tensor, key: Tensor) -> Tensor:
    """(B, Lq), (B, Lk) segment ids -> (B, 1, Lq, Lk), True where both are of one pair. Padding
    queries see every key: no softmax row is empty (NaN), and padding carries no loss."""
    return ((query[:, :, None] == key[:, None, :]) | (query == 0)[:, :, None])[:, None]


# -- 3.2 Attention ---------------------------------------------------------------------

_FEW_QUERIES = 8


def attention_weights(q: Tensor, k: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    """softmax(Q K^T / sqrt(d_k)) per head, (..., Lq, Lk); ``mask`` True where attending is allowed."""
    scores = (q @ k.transpose(-1, -2)) * (q.size(-1) ** -0.5)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(dim=-1)


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor] = None, causal: bool = False,
              dropout: float = 0.0) -> Tensor:
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V (3.2.1), per head.

    ``F.scaled_dot_product_attention`` computes it, except for the handful of queries of
    an incremental decoding step (no gradients), where its tiled CPU kernel costs more than
    the plain matmul-softmax-matmul written here (docs/benchmarks/decoding.md, "Decoding
    speed: KV cache, CTranslate2 export, OpenNMT-py").
    """
    q = q.to(k.dtype)  # a bf16 model on a CPU keeps its decoding cache in fp32 (see DecoderLayer.cached)
    if q.size(-2) > _FEW_QUERIES or causal or dropout > 0.0 or torch.is_grad_enabled():
        if (q.device.type == "cpu" and torch.is_grad_enabled() and not cuda_code_path()
                and (q.dtype != torch.float32 or torch.is_autocast_enabled("cpu"))):
            # Training under CPU autocast (bf16 q, k, v, or fp32 ones from the padded path): the
            # CPU flash-attention kernel's bf16 backward is several times slower than its fp32 one
            # (docs/benchmarks/cpu-speed.md, "Where the time went, and what changed"), so the
            # scores are computed in fp32, outside autocast (which would cast them back), and
            # only the projections around them in bf16.
            with torch.autocast("cpu", enabled=False):
                return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask,
                                                      is_causal=causal, dropout_p=dropout)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, dropout_p=dropout)
    return attention_weights(q, k, mask) @ v


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O, head_i = Attention(Q W^Q_i, K W^K_i, V W^V_i).

    Scaled dot-product attention itself is ``attention`` above. Keys and values
    share one projection so the encoder-decoder case computes them in one matmul.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float):
        super().__init__()
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.q_proj = Linear(d_model, d_model)
        self.kv_proj = Linear(d_model, 2 * d_model)
        self.out_proj = Linear(d_model, d_model)
        self.dropout = dropout

    def _split_heads(self, x: Tensor) -> Tensor:  # (B, L, D) -> (B, H, L, D/H)
        return x.view(x.size(0), x.size(1), self.n_heads, self.d_head).transpose(1, 2)

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        k, v = self.kv_proj(memory).chunk(2, dim=-1)
        return self._split_heads(k), self._split_heads(v)

    def forward(
        self,
        query: Tensor,
        memory: Optional[Tensor] = None,
        mask: Optional[Tensor] = None,
        causal: bool = False,
        kv: Optional[tuple[Tensor, Tensor]] = None,
    ) -> Tensor:
        """``memory`` is what is attended to (``query`` itself for self-attention);
        ``kv`` passes keys and values already projected (the decoding cache)."""
        if kv is None and cpu_bf16_training(query, self.q_proj.weight):
            return self._padded_forward(query, memory, mask, causal)
        q, k, v = self._project(query, memory, kv)
        out = attention(q, k, v, mask, causal, self.dropout if self.training else 0.0)
        return self.out_proj(out.transpose(1, 2).reshape(query.shape))

    def _project(self, query: Tensor, memory: Optional[Tensor],
                 kv: Optional[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor, Tensor]:
        """Q, K and V split into heads. Self-attention training on CUDA in half precision takes
        them from one product (``stacked_half_product``: the half weight cache stacks q_proj and
        kv_proj, ``shared_input_linears``); elsewhere each projection is its own."""
        if kv is None and memory is None:
            qkv = stacked_half_product(query, self.shared_input_linears())
            if qkv is not None:
                q, k, v = (self._split_heads(t) for t in qkv.chunk(3, dim=-1))
                return q, k, v
        k, v = kv if kv is not None else self.project_kv(query if memory is None else memory)
        return self._split_heads(self.q_proj(query)), k, v

    def shared_input_linears(self) -> tuple[Linear, Linear]:
        """The projections self-attention applies to one input (see ``HalfWeightCache``)."""
        return self.q_proj, self.kv_proj

    def _padded_forward(self, query: Tensor, memory: Optional[Tensor], mask: Optional[Tensor], causal: bool) -> Tensor:
        """``forward`` when training in bf16 on a CPU: the projections on rows padded once per
        input (q, k and v of self-attention in one product), q, k, v cast to fp32 in one copy
        each (attention itself runs in fp32 there, see ``attention``), and the heads read
        straight into the output projection's padded rows."""
        if memory is None:
            weight = torch.cat([self.q_proj.weight, self.kv_proj.weight])
            bias = None if self.q_proj.bias is None else torch.cat([self.q_proj.bias, self.kv_proj.bias])
            q, k, v = padded_bf16_block(query, lambda rows: F.linear(rows, weight, bias)).float().chunk(3, dim=-1)
        else:
            q = padded_bf16_block(query, self.q_proj).float()
            k, v = padded_bf16_block(memory, self.kv_proj).float().chunk(2, dim=-1)
        out = attention(self._split_heads(q), self._split_heads(k), self._split_heads(v), mask, causal,
                        self.dropout if self.training else 0.0)
        return padded_bf16_block(out.transpose(1, 2), self.out_proj, row_dims=2)

    def weights(self, query: Tensor, memory: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        """softmax(Q K^T / sqrt(d_k)) per head, (B, H, Lq, Lk): what ``forward`` computes
        inside the fused kernel, spelled out for attention plots."""
        q = self._split_heads(self.q_proj(query))
        k, _ = self.project_kv(memory)
        return attention_weights(q, k, mask)


# -- 3.3 Position-wise feed-forward network -------------------------------------------

_FUNCTIONS = {"relu": F.relu, "swish": F.silu, "silu": F.silu, "gelu": F.gelu}
# The names are model/config.py's (what config.py accepts); a name without a function fails here.
ACTIVATIONS = {name: _FUNCTIONS[name] for name in ACTIVATION_NAMES}


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2; ``activation`` replaces the max(0, .) (ACTIVATIONS)."""

    def __init__(self, d_model: int, d_ff: int, activation_dropout: float, activation: str = "relu"):
        super().__init__()
        self.w1 = Linear(d_model, d_ff)
        self.w2 = Linear(d_ff, d_model)
        self.dropout = Dropout(activation_dropout)
        self.activation = ACTIVATIONS[activation]

    def forward(self, x: Tensor) -> Tensor:
        if cpu_bf16_training(x, self.w1.weight):  # pad the rows once for both products
            return padded_bf16_block(x, self._ffn)
        return self._ffn(x)

    def _ffn(self, x: Tensor) -> Tensor:
        return self.w2(self.dropout(self.activation(self.w1(x))))


class Sublayer(nn.Module):
    """The residual wrapper of 3.1 and 5.4: LayerNorm(x + Dropout(Sublayer(x))).

    With ``pre_norm`` it is x + Dropout(Sublayer(LayerNorm(x))) instead, which trains
    more stably for deep stacks.
    """

    def __init__(self, d_model: int, dropout: float, pre_norm: bool):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout)
        self.pre_norm = pre_norm

    def forward(self, x: Tensor, fn: Callable[[Tensor], Tensor]) -> Tensor:
        if self.pre_norm:
            return x + self.dropout(fn(self.norm(x)))
        return self.norm(x + self.dropout(fn(x)))


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each inside a residual sublayer (3.1)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation_dropout, cfg.activation)
        self.sub_attn = Sublayer(cfg.d_model, cfg.dropout, cfg.pre_norm)
        self.sub_ffn = Sublayer(cfg.d_model, cfg.dropout, cfg.pre_norm)

    def forward(self, x: Tensor, src_mask: Tensor) -> Tensor:
        x = self.sub_attn(x, lambda h: self.self_attn(h, mask=src_mask))
        return self.sub_ffn(x, self.ffn)


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder attention, feed-forward (3.1).

    With a ``cache`` dict the layer decodes incrementally: it appends this step's
    keys/values to ``cache["k"]``/``cache["v"]`` and reuses the encoder keys/values
    in ``cache["mem_k"]``/``cache["mem_v"]``, computed once per sentence. Then ``y`` holds
    the newest position of every beam, sentence-major (B*K, 1, D), while ``memory`` has one
    row per sentence (B, S, D): the K beams of a sentence are K queries against one memory.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation_dropout, cfg.activation)
        self.sub_self = Sublayer(cfg.d_model, cfg.dropout, cfg.pre_norm)
        self.sub_cross = Sublayer(cfg.d_model, cfg.dropout, cfg.pre_norm)
        self.sub_ffn = Sublayer(cfg.d_model, cfg.dropout, cfg.pre_norm)

    def forward(
        self, y: Tensor, memory: Tensor, src_mask: Tensor, cache: Optional[dict] = None,
        attention: Optional[list] = None, self_mask: Optional[Tensor] = None,
    ) -> Tensor:
        """``attention``, when a list, receives this layer's encoder-decoder attention weights;
        ``self_mask`` replaces the causal mask (packed rows: causal within each pair)."""
        if cache is None:
            y = self.sub_self(y, lambda h: self.self_attn(h, mask=self_mask, causal=self_mask is None))
            y = self.sub_cross(y, lambda h: self._cross_attn(h, memory, src_mask, attention))
        else:
            y = self.sub_self(y, lambda h: self._cached_self_attn(h, cache))
            if "mem_k" not in cache:
                cache["mem_k"], cache["mem_v"] = map(self.cached, self.cross_attn.project_kv(memory))
            y = self.sub_cross(y, lambda h: self._cached_cross_attn(h, src_mask, cache))
        return self.sub_ffn(y, self.ffn)

    def _cross_attn(self, h: Tensor, memory: Tensor, src_mask: Tensor, attention: Optional[list]) -> Tensor:
        if attention is not None:
            attention.append(self.cross_attn.weights(h, memory, src_mask))
        return self.cross_attn(h, memory, mask=src_mask)

    def _cached_self_attn(self, h: Tensor, cache: dict) -> Tensor:
        # One new position attends to every earlier one, so no causal mask is needed.
        k, v = map(self.cached, self.self_attn.project_kv(h))
        if "k" in cache:
            k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)
        cache["k"], cache["v"] = k, v
        return self.self_attn(h, kv=(k, v))

    @staticmethod
    def cached(t: Tensor) -> Tensor:
        """Keys/values as the decoding cache holds them: bf16 ones as fp32 on a CPU. A step's
        attention is a few small products whose key length grows every step; in bf16 each new
        shape would cost a oneDNN kernel compilation, in fp32 (MKL) nothing. Other dtypes stay
        (fp16 weights on a CPU then run as CUDA runs them)."""
        return t.float() if t.device.type == "cpu" and t.dtype == torch.bfloat16 else t

    def _cached_cross_attn(self, h: Tensor, src_mask: Tensor, cache: dict) -> Tensor:
        sentences = cache["mem_k"].size(0)
        beams = h.view(sentences, -1, h.size(-1))  # (B*K, 1, D) -> (B, K, D)
        out = self.cross_attn(beams, mask=src_mask, kv=(cache["mem_k"], cache["mem_v"]))
        return out.view(h.shape)


# -- 3.1 Encoder and decoder stacks -------------------------------------------------------

class Transformer(nn.Module):
    """Encoder-decoder Transformer. ``forward`` gives logits for teacher forcing;
    ``encode`` / ``decode_step`` are what search uses.

    ``src_vocab``: the source vocabulary (the joint one when shared); ``tgt_vocab`` 0 (or
    equal to it): one vocabulary for both sides."""

    def __init__(self, cfg: ModelConfig, src_vocab: int, tgt_vocab: int = 0, pad_id: int = 0):
        super().__init__()
        self.cfg = cfg
        self.pad_id = pad_id
        self.src_vocab, self.tgt_vocab = src_vocab, tgt_vocab or src_vocab
        self.joint_vocab = self.tgt_vocab == src_vocab
        d = cfg.d_model
        src_tokens = nn.Embedding(src_vocab, d, padding_idx=pad_id)
        share = (cfg.tie_embeddings if cfg.share_embeddings is None else cfg.share_embeddings) and self.joint_vocab
        tgt_tokens = src_tokens if share else nn.Embedding(self.tgt_vocab, d, padding_idx=pad_id)
        self.src_embed = Embedding(src_tokens, d, cfg.max_positions, cfg.dropout, cfg.scale_embedding)
        self.tgt_embed = Embedding(tgt_tokens, d, cfg.max_positions, cfg.dropout, cfg.scale_embedding)
        self.encoder_layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        # Pre-norm stacks end with a LayerNorm; post-norm outputs are already normalised.
        self.encoder_norm = nn.LayerNorm(d) if cfg.pre_norm else nn.Identity()
        self.decoder_norm = nn.LayerNorm(d) if cfg.pre_norm else nn.Identity()
        self.generator = Linear(d, self.tgt_vocab, bias=False)
        self._reset_parameters()
        if cfg.tie_embeddings:  # the pre-softmax matrix is the target embedding (3.4)
            self.generator.weight = tgt_tokens.weight
        if cfg.final_logits_bias:  # a buffer: Marian's is not trained either
            self.register_buffer("logits_bias", torch.zeros(self.tgt_vocab))
        if cfg.output_pieces:
            # A joint vocabulary holds pieces the target side never uses (English-only ones in
            # an en->de model); the output layer scores only the others, and decoding gives the
            # rest -inf. ``restrict_output`` sets them (the state dict carries them).
            self.register_buffer("output_pieces", torch.arange(cfg.output_pieces))
            self.register_buffer("_position_of", torch.zeros(self.tgt_vocab, dtype=torch.long), persistent=False)
            self.register_buffer("_unscored", torch.zeros(self.tgt_vocab), persistent=False)
            self.register_load_state_dict_post_hook(lambda module, _keys: module._index_output_pieces())
            self._index_output_pieces()

    def restrict_output(self, pieces: Tensor) -> None:
        """Score only ``pieces`` (sorted ids, as many as ``cfg.output_pieces``, the special ids
        0..3 among them: padding keeps position 0)."""
        if pieces.numel() != self.cfg.output_pieces:
            raise ValueError(f"{pieces.numel()} output pieces for a model built for {self.cfg.output_pieces}")
        self.output_pieces.copy_(pieces)
        self._index_output_pieces()

    def _index_output_pieces(self) -> None:
        scored = self.output_pieces
        # An id the layer does not score (a valid reference's piece unseen in training) is
        # scored as unknown: position 1 (the sorted special ids lead).
        self._position_of.fill_(1).index_copy_(0, scored, torch.arange(scored.numel(), device=scored.device))
        self._unscored.fill_(float("-inf")).index_fill_(0, scored, 0.0)

    def output_bias(self) -> Optional[Tensor]:
        """(V,) what decoding adds to the logits: Marian's logits bias, -inf on the pieces the
        output layer does not score; None when there is nothing to add."""
        bias = self.logits_bias if self.cfg.final_logits_bias else None
        if self.cfg.output_pieces:
            bias = self._unscored if bias is None else bias + self._unscored.to(bias.dtype)
        return bias

    def logits(self, hidden: Tensor) -> Tensor:
        """The pre-softmax linear transformation (3.4) over the whole vocabulary, plus
        ``output_bias``: what decoding takes."""
        out = self.generator(hidden)
        bias = self.output_bias()
        return out if bias is None else out + bias.to(out.dtype)

    def scored_logits(self, hidden: Tensor) -> Tensor:
        """The logits of the pieces the output layer scores, in ``output_pieces``' order (all
        of the vocabulary unless restricted): what training takes, with ``scored_targets``."""
        if not self.cfg.output_pieces:
            return self.logits(hidden)
        out = self.generator(hidden, rows=self.output_pieces)
        if self.cfg.final_logits_bias:
            out = out + self.logits_bias[self.output_pieces].to(out.dtype)
        return out

    def scored_targets(self, tgt: Tensor) -> Tensor:
        """Gold ids -> their positions among ``scored_logits``' columns (ids as they are unless restricted)."""
        return self._position_of[tgt] if self.cfg.output_pieces else tgt

    def _reset_parameters(self) -> None:
        for name, p in self.named_parameters():
            if p.dim() > 1 and "tokens" not in name:
                nn.init.xavier_uniform_(p)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)
        # Embeddings get N(0, d^-1/2): times sqrt(d) they start at unit scale, like the positions.
        # A fixed order (source, then target when not shared): a set's order follows object ids,
        # so two models built from one seed got different embeddings.
        shared = self.src_embed.tokens is self.tgt_embed.tokens
        for emb in (self.src_embed.tokens,) if shared else (self.src_embed.tokens, self.tgt_embed.tokens):
            nn.init.normal_(emb.weight, mean=0.0, std=self.cfg.d_model ** -0.5)
            with torch.no_grad():
                emb.weight[self.pad_id].zero_()

    def padding_mask(self, src: Tensor) -> Tensor:
        """(B, S) ids -> (B, 1, 1, S) mask, True on real tokens."""
        return (src != self.pad_id)[:, None, None, :]

    def encode(self, src: Tensor, src_mask: Optional[Tensor] = None, positions: Optional[Tensor] = None) -> Tensor:
        src_mask = self.padding_mask(src) if src_mask is None else src_mask
        x = self.src_embed(src, positions=positions)
        for layer in self.encoder_layers:
            x = layer(x, src_mask)
        return self.encoder_norm(x)

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor, self_mask: Optional[Tensor] = None,
               positions: Optional[Tensor] = None) -> Tensor:
        """Teacher-forced decoder: (B, T) ids -> (B, T, D) hidden states."""
        y = self.tgt_embed(tgt_in, positions=positions)
        for layer in self.decoder_layers:
            y = layer(y, memory, src_mask, self_mask=self_mask)
        return self.decoder_norm(y)

    def forward(self, src: Tensor, tgt_in: Tensor, packing: Optional[Packing] = None) -> Tensor:
        """Logits (B, T, scored pieces) for teacher forcing (``scored_logits``: the gold ids
        index them through ``scored_targets``); with ``packing``, rows hold several pairs each."""
        if packing is None:
            (src_mask,) = self._sdpa_masks(self.padding_mask(src))
            return self.scored_logits(self.decode(tgt_in, self.encode(src, src_mask), src_mask))
        encoder_mask, decoder_mask, cross_mask = self._sdpa_masks(*packing.masks())  # once, for every layer
        memory = self.encode(src, encoder_mask, packing.src_positions)
        return self.scored_logits(self.decode(tgt_in, memory, cross_mask, decoder_mask, packing.tgt_positions))

    def _sdpa_masks(self, *masks: Tensor) -> tuple[Tensor, ...]:
        """Training on CUDA's path: each boolean mask as the additive one (0 where attending is
        allowed, -inf elsewhere, in the dtype attention computes in) that
        ``F.scaled_dot_product_attention`` would otherwise make from it at every call: made once
        for every layer, three kernels instead of three a layer. Elsewhere (a CPU's own attention
        path, decoding) the masks as they are."""
        kind = masks[0].device.type
        if not torch.is_grad_enabled() or not (kind == "cuda" or cuda_code_path()):
            return masks
        autocast = torch.is_autocast_enabled(kind)
        dtype = torch.get_autocast_dtype(kind) if autocast else self.src_embed.tokens.weight.dtype
        return tuple(torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill_(~m, float("-inf")) for m in masks)

    def decode_step(self, last_tokens: Tensor, memory: Tensor, src_mask: Tensor, cache: Optional[list[dict]]) -> Tensor:
        """One incremental step: (B*K, 1) newest tokens of K beams per sentence (sentence-major)
        -> (B*K, V) float32 logits of the next token (search normalises them only where it
        needs to); ``memory`` (B, S, D) and ``src_mask`` have one row per sentence.

        ``cache`` is a list with one dict per decoder layer, empty at step 0. Without a
        cache (None), ``last_tokens`` is the whole prefix (B*K, T) and every position is
        recomputed: the slow reference the cache is measured and tested against.
        """
        if cache is None:
            beams = last_tokens.size(0) // memory.size(0)
            memory, src_mask = memory.repeat_interleave(beams, dim=0), src_mask.repeat_interleave(beams, dim=0)
            return self.logits(self.decode(last_tokens, memory, src_mask)[:, -1]).float()
        offset = cache[0]["k"].size(2) if "k" in cache[0] else 0
        y = self.tgt_embed(last_tokens, offset=offset)
        for layer, layer_cache in zip(self.decoder_layers, cache):
            y = layer(y, memory, src_mask, layer_cache)
        return self.logits(self.decoder_norm(y))[:, -1].float()

    @torch.no_grad()
    def cross_attention(self, src: Tensor, tgt_in: Tensor) -> list[Tensor]:
        """Encoder-decoder attention weights of every decoder layer, each (B, H, T, S)."""
        src_mask = self.padding_mask(src)
        memory = self.encode(src, src_mask)
        y = self.tgt_embed(tgt_in)
        maps: list[Tensor] = []
        for layer in self.decoder_layers:
            y = layer(y, memory, src_mask, attention=maps)
        return maps

    def new_cache(self) -> list[dict]:
        return [{} for _ in self.decoder_layers]

    def count_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())  # tied weights are counted once


def reorder_cache(cache: Optional[list[dict]], beams: Tensor, sentences: Optional[Tensor] = None) -> None:
    """Select rows of every cached tensor: ``beams`` for the per-beam self-attention keys and
    values (beam reordering, finished sentences leaving), ``sentences`` for the per-sentence
    encoder keys/values (None: the sentences stay as they are, as when beams only move
    among those of their own sentence)."""
    for layer_cache in cache or ():
        for key, value in layer_cache.items():
            order = sentences if key.startswith("mem_") else beams
            if order is not None:
                layer_cache[key] = value.index_select(0, order)
