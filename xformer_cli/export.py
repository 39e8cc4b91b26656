"""Export a checkpoint to a CTranslate2 model directory, and translate with it.

    from xformer_cli.export import export_ctranslate2, CTranslate2Translator
    export_ctranslate2("runs/multi30k/best.pt", "runs/multi30k/ct2", quantization="int8")
    CTranslate2Translator.from_directory("runs/multi30k/ct2").translate(["A man rides a bike."])

The exported directory holds what CTranslate2 reads (``model.bin``, ``config.json``,
``shared_vocabulary.json`` or ``source_vocabulary.json`` + ``target_vocabulary.json``),
the sentencepiece model(s) (``spm.model`` when joint, else ``source.spm.model`` and
``target.spm.model``) and ``xformer_export.json`` (decode defaults, language codes, xformer version).

The spec mirrors ``model/transformer.py`` exactly: fused q/k/v for self-attention, query
plus fused k/v for encoder-decoder attention, post- or pre-norm sublayers (pre-norm
stacks keep their final LayerNorm), embeddings times sqrt(d_model), and xformer's own
interleaved sinusoidal table as the position encodings. Greedy outputs therefore equal
``Translator.translate(..., beam_size=1)``; beam search differs in its stopping rule
(see the note on beam search below).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, Optional, Sequence

from xformer_cli.config import DecodeConfig, ModelSection
from xformer_cli.errors import XformerError, disk_full, disk_full_error
from xformer_cli.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer

MISSING_CT2 = "CTranslate2 export needs the ctranslate2 package: pip install 'xformer[ctranslate2]'"
EXPORT_INFO = "xformer_export.json"
JOINT_SPM, SOURCE_SPM, TARGET_SPM = "spm.model", "source.spm.model", "target.spm.model"
MIN_POSITIONS = 1024  # rows of the exported position table at least (CTranslate2 cannot grow it)
LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default; CTranslate2's own default is not the same
# Model options the exporter knows how to map; a checkpoint with any other is refused.
_KNOWN_MODEL_KEYS = {f.name for f in fields(ModelSection)}

# The note on beam search. xformer ranks finished hypotheses by GNMT's length penalty,
#   logprob / ((5 + |Y|) / 6) ** alpha      (|Y| counts eos),
# and stops a sentence once no live beam can beat its finished ones. CTranslate2 4.x has
# no GNMT form: its length_penalty divides by |Y| ** length_penalty (|Y| without eos),
# and with a non-zero one it stops as soon as beam_size hypotheses have finished, short
# ones included, which loses long good ones (a memorised sentence came out with a piece
# missing). So we run CTranslate2 with length_penalty 0: scores are plain log-probabilities
# and a sentence ends once its best beam has finished (no longer hypothesis can beat it on
# log-probability). We take all beam_size finished hypotheses and pick the best by GNMT's
# formula. On a tiny test model this matched xformer's beam output on 227 of 230 Multi30k
# sentences (203 when alpha is passed as CTranslate2's own exponent), all memorised ones
# included; equality is not guaranteed, as the stopping rules differ. Greedy search is
# unaffected: it gives exactly xformer's tokens and log-probabilities.


def _import_ct2() -> Any:
    try:
        import ctranslate2
    except ImportError:
        raise XformerError(MISSING_CT2) from None
    return ctranslate2


# -- export ------------------------------------------------------------------------------

def export_ctranslate2(
    checkpoint: str | Path, output_dir: str | Path, quantization: Optional[str] = None, force: bool = False
) -> Path:
    """Write ``checkpoint`` as a CTranslate2 model directory at ``output_dir``; returns it.

    An existing non-empty ``output_dir`` is refused unless ``force``. The model is built in
    a temporary sibling directory and renamed into place, so an interrupted export never
    leaves a half-written model where a good one was.
    """
    _import_ct2()
    output = Path(os.path.abspath(output_dir))  # "." and "a/.." have a name to rename
    _check_output(output, force)
    model, tokenizer, config = _load(checkpoint)
    spec = _build_spec(model, tokenizer)
    try:
        spec.validate()
        spec.optimize(quantization=quantization)
    except ValueError as exc:  # a bad quantization name, or a spec the weights do not fill
        raise XformerError(f"CTranslate2 export failed: {str(exc).strip().splitlines()[0]}") from None
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", suffix=".tmp", dir=output.parent))
    try:
        spec.save(str(staging))
        _write_extras(staging, tokenizer, config, quantization, model.cfg)
        _replace_dir(staging, output)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if disk_full(exc):
            intact = f"the previous {output.name} is unchanged" if output.exists() else "no partial export was left"
            raise disk_full_error(output, intact=intact) from None
        raise
    return output


def _check_output(output: Path, force: bool) -> None:
    if output.exists() and not output.is_dir():
        raise XformerError(f"{output} exists and is not a directory")
    if output.is_dir() and any(output.iterdir()) and not force:
        raise XformerError(f"{output} exists and is not empty (use --force to replace it)")


def _load(checkpoint: str | Path):
    """The model, tokenizer and config of a checkpoint, read the way ``Translator`` does."""
    from xformer_cli.decode.translator import load_model
    from xformer_cli.train.checkpoint import load_checkpoint

    state = load_checkpoint(checkpoint)
    unknown = sorted(set(state.get("config", {}).get("model", {})) - _KNOWN_MODEL_KEYS)
    if unknown:
        raise XformerError(f"{checkpoint}: cannot export to CTranslate2: unsupported model option(s) {', '.join(unknown)}")
    return load_model(checkpoint, state)


def _special_pieces(tokenizer: Tokenizer) -> dict[str, str]:
    """unk/bos/eos/pad pieces; CTranslate2 has one name per role, so both sides must agree."""
    names = {}
    for role, i in (("unk", UNK_ID), ("bos", BOS_ID), ("eos", EOS_ID), ("pad", PAD_ID)):
        src, tgt = tokenizer.src.id_to_piece(i), tokenizer.tgt.id_to_piece(i)
        if src != tgt:
            raise XformerError(f"cannot export to CTranslate2: the {role} piece differs between source ({src!r}) and target ({tgt!r}) tokenizers")
        names[role] = src
    return names


def _vocabulary(sp) -> list[str]:
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size())]


def _build_spec(model, tokenizer: Tokenizer):
    """A ``TransformerSpec`` filled with the model's weights and the tokenizer's pieces."""
    from ctranslate2.specs import transformer_spec

    cfg = model.cfg
    if cfg.d_model % cfg.n_heads:
        raise XformerError(f"cannot export to CTranslate2: d_model {cfg.d_model} is not divisible by n_heads {cfg.n_heads}")
    spec = transformer_spec.TransformerSpec.from_config(
        (cfg.encoder_layers, cfg.decoder_layers), cfg.n_heads, pre_norm=cfg.pre_norm
    )
    positions = _position_table(cfg)
    _set_encoder(spec.encoder, model, positions)
    _set_decoder(spec.decoder, model, positions)
    special = _special_pieces(tokenizer)
    spec.config.unk_token = special["unk"]
    spec.config.bos_token = special["bos"]
    spec.config.eos_token = special["eos"]
    spec.config.decoder_start_token = special["bos"]  # xformer's target starts with bos (id 2)
    spec.config.add_source_eos = True  # xformer's source ends with eos (id 3)
    spec.config.layer_norm_epsilon = LAYER_NORM_EPS
    spec.register_source_vocabulary(_vocabulary(tokenizer.src))
    spec.register_target_vocabulary(_vocabulary(tokenizer.tgt))
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
    spec.scale_embeddings = True
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
    spec.projection.weight = _np(model.generator.weight)  # no bias, like xformer's generator
    for layer_spec, layer in zip(spec.layer, model.decoder_layers):
        _set_self_attention(layer_spec.self_attention, layer.self_attn, layer.sub_self.norm)
        _set_cross_attention(layer_spec.attention, layer.cross_attn, layer.sub_cross.norm)
        _set_ffn(layer_spec.ffn, layer.ffn, layer.sub_ffn.norm)
    if model.cfg.pre_norm:
        _set_layer_norm(spec.layer_norm, model.decoder_norm)


def _write_extras(directory: Path, tokenizer: Tokenizer, config, quantization: Optional[str], model_cfg) -> None:
    """The sentencepiece model(s) and ``xformer_export.json`` next to CTranslate2's files."""
    from xformer_cli import __version__

    if tokenizer.joint:
        (directory / JOINT_SPM).write_bytes(tokenizer.src_model_bytes)
    else:
        (directory / SOURCE_SPM).write_bytes(tokenizer.src_model_bytes)
        (directory / TARGET_SPM).write_bytes(tokenizer.tgt_model_bytes)
    info = {
        "format": "xformer-ctranslate2",
        "xformer_version": __version__,
        "joint_vocab": tokenizer.joint,
        "src_lang": config.data.src_lang,  # what xformer serve offers in /languages
        "tgt_lang": config.data.tgt_lang,
        "quantization": quantization,
        "max_positions": max(model_cfg.max_positions, MIN_POSITIONS),
        "decode": asdict(config.decode_settings()),
    }
    (directory / EXPORT_INFO).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")


def _replace_dir(staging: Path, output: Path) -> None:
    """Move ``staging`` to ``output``; an old ``output`` is set aside first and removed last."""
    old = None
    if output.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{output.name}.", suffix=".old", dir=output.parent))
        os.replace(output, old / output.name)
    try:
        os.replace(staging, output)
    except BaseException:
        if old is not None:  # put the previous model back
            os.replace(old / output.name, output)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# -- translation -----------------------------------------------------------------------------

class CTranslate2Translator:
    """Translate with an exported directory; same input/output conventions as ``Translator``."""

    def __init__(self, translator: Any, tokenizer: Tokenizer, decode: DecodeConfig, max_positions: int):
        self.translator = translator
        self.tokenizer = tokenizer
        self.decode = decode
        self.max_positions = max_positions
        self.truncated_lines = 0  # input lines cut to decode.max_input_len
        self.src_pieces = _vocabulary(tokenizer.src)
        self.tgt_ids = {piece: i for i, piece in enumerate(_vocabulary(tokenizer.tgt))}
        self.suppress = [[tokenizer.tgt.id_to_piece(PAD_ID)], [tokenizer.tgt.id_to_piece(BOS_ID)]]

    @classmethod
    def from_directory(
        cls, path: str | Path, device: str = "cpu", compute_type: str = "default", threads: int = 0
    ) -> "CTranslate2Translator":
        """Load a directory written by ``export_ctranslate2``; ``threads`` 0 = CTranslate2's default."""
        ctranslate2 = _import_ct2()
        path = Path(path)
        info_path = path / EXPORT_INFO
        if not path.is_dir():
            raise XformerError(f"CTranslate2 model directory not found: {path}")
        if not info_path.is_file() or not (path / "model.bin").is_file():
            raise XformerError(f"{path} is not an xformer CTranslate2 export (no {EXPORT_INFO} or model.bin)")
        try:
            info = json.loads(info_path.read_text(encoding="utf-8"))
            decode = DecodeConfig(**info["decode"])
            if info["joint_vocab"]:
                tokenizer = Tokenizer((path / JOINT_SPM).read_bytes())
            else:
                tokenizer = Tokenizer((path / SOURCE_SPM).read_bytes(), (path / TARGET_SPM).read_bytes())
            translator = ctranslate2.Translator(str(path), device=device, compute_type=compute_type, intra_threads=threads)
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
            raise XformerError(f"{path}: cannot load the CTranslate2 model ({type(exc).__name__}: {str(exc).strip()[:160]})") from None
        return cls(translator, tokenizer, decode, int(info.get("max_positions", MIN_POSITIONS)))

    def translate(self, lines: Sequence[str], **options) -> list[str]:
        """One output line per input line, in input order; blank input gives blank output.
        ``options``: beam_size, length_penalty, max_len_a, max_len_b, batch_size, max_tokens."""
        hyps = self.translate_ids(lines, **options)
        return [self.tokenizer.decode_tgt([h.tokens])[0] if h is not None else "" for h in hyps]

    def translate_ids(self, lines: Sequence[str], **options):
        """The best ``Hypothesis`` per line, in input order (None for a blank line), like
        xformer's ``Translator.search`` with one hypothesis per line.

        ``logprob`` is the sum of token log-probabilities, eos included (pad and bos are
        left out of CTranslate2's softmax, so it is a hair higher than xformer's); ``score``
        is it over GNMT's length penalty (itself for greedy search). A hypothesis cut at
        the length limit keeps the log-probability of the uncut one.
        """
        from xformer_cli.data.batching import encode_source_batch
        from xformer_cli.decode.search import Hypothesis, max_lengths
        from xformer_cli.decode.translator import resolve_options, source_batches

        opts = resolve_options(self.decode, **options)
        beam, alpha, a, b = opts.beam_size, opts.length_penalty, opts.max_len_a, opts.max_len_b
        encoded, batches, cut = source_batches(self.tokenizer, lines, opts)
        self.truncated_lines += cut
        results: list[Optional[Hypothesis]] = [None] * len(lines)
        for chunk in batches:
            # The same per-sentence limits as xformer's search (float32 arithmetic included).
            limits = max_lengths(encode_source_batch([encoded[i] for i in chunk]), PAD_ID, a, b).tolist()
            for i, hyp in zip(chunk, self._translate_chunk([encoded[i] for i in chunk], limits, beam, alpha, opts.min_len)):
                results[i] = hyp
        return results

    def _translate_chunk(self, sources: list[list[int]], limits: list[int], beam: int, alpha: float, min_len: int):
        # CTranslate2 takes one max_decoding_length per call, so the batch gets the longest
        # source's limit (a * source length + b, eos counted) and each output is then cut
        # to its own: exact for greedy search, whose first tokens do not depend on the limit
        # (beam search, where xformer forces eos at the limit, may differ there). +1 because
        # CTranslate2 counts the eos step in the limit; xformer allows `limit` tokens, then eos.
        # The position table bounds both lengths (xformer grows its table; CTranslate2 cannot).
        max_length = min(max(limits) + 1, self.max_positions)
        alpha = 0.0 if beam == 1 else alpha  # see the note on beam search at the top
        out = self.translator.translate_batch(
            [[self.src_pieces[t] for t in ids] for ids in sources],
            beam_size=beam,
            num_hypotheses=beam,
            length_penalty=0.0,  # scores are plain log-probabilities, eos included
            max_decoding_length=max_length,
            min_decoding_length=min_len,  # pieces before eos, as xformer counts them
            max_input_length=self.max_positions - 1,  # one position left for the added eos
            suppress_sequences=self.suppress,  # xformer never emits pad or bos either
            return_scores=True,
        )
        return [self._best(result, limit, alpha) for result, limit in zip(out, limits)]

    def _best(self, result: Any, limit: int, alpha: float):
        """The hypothesis GNMT's length penalty prefers, cut to ``limit`` tokens."""
        from xformer_cli.decode.search import Hypothesis, length_penalty

        best = None
        for pieces, logprob in zip(result.hypotheses, result.scores):
            tokens = [self.tgt_ids[piece] for piece in pieces][:limit]
            hyp = Hypothesis(tokens, logprob / length_penalty(len(tokens) + 1, alpha), logprob)  # + 1: eos
            if best is None or hyp.score > best.score:
                best = hyp
        return best
