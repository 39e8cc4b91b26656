"""Import a Hugging Face MarianMT (OPUS-MT) model as an ordinary xformer checkpoint.

    from xformer_cli.importers.marian import import_marian, load_marian
    import_marian("opus-mt-en-de/", "en-de.pt")          # or a Hub id: "Helsinki-NLP/opus-mt-en-de"
    state = load_marian("opus-mt-en-de/")                # the checkpoint's dict, unsaved

The inverse of ``export/huggingface.py``, with what OPUS-MT adds to the models xformer
trains itself:

- The hidden dimension is permuted back: Marian lists every sine of its position table
  first and every cosine second, xformer interleaves them (see the exporter's docstring).
- Ids: xformer needs pad 0, unk 1 and eos 3; Marian has eos 0, unk 1, pad last. The
  vocabulary is renumbered (pad, unk and eos to xformer's ids, bos too where the model has
  one of its own, every other piece in Marian's order after them) and the rows of the
  embeddings, output matrix and logits bias follow. OPUS-MT's decoder starts with pad:
  ``model.bos_id`` becomes 0 then. Pieces map to ids through vocab.json, so source.spm and
  target.spm share one id space (``Tokenizer``'s vocabulary kind).
- swish, ``final_logits_bias``, embedding scaling, shared or untied embeddings: the
  model options of the same names.
- A multilingual OPUS-MT model's tags (``>>fra<<`` in vocab.json) stay pieces of the
  vocabulary; each becomes a target language (fr), and the model translates with its own
  tags (``data.pairs``, ``data.lang_tags`` where a tag is not xformer's name for the code).
- Decode defaults from the generation config: ``num_beams``; ``max_new_tokens`` (eos
  included) or ``max_length`` (decoder start and eos included) as one limit, max_len_a 0 and
  max_len_b the pieces before eos; ``min_new_tokens``; ``length_penalty`` as GNMT alpha =
  length_penalty / HF_LENGTH_PENALTY_SCALE, the exporter's mapping inverted (no setting
  makes the two penalties rank alike at every length: see export/huggingface.py).

Refused in one line naming the key or tensor (``importers/marian_files.py``): another
model_type (BART, T5, mBART; a pegasus directory is read as the pre-norm model ``xformer
export`` writes, with its final LayerNorms), an activation xformer lacks,
``add_bias_logits``, pre-norm or embedding LayerNorms in a Marian config, weights whose shapes
contradict config.json, tensors no MarianMT part explains, a missing vocab.json.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Optional

import torch

from xformer_cli.checkpoint_file import FORMAT, VERSION, build_model, save_checkpoint
from xformer_cli.config import Config, CorpusConfig, DataConfig, DecodeConfig, PairConfig, TokenizerConfig, validate
from xformer_cli.errors import XformerError
from xformer_cli.export.format import export_languages, read_export_info
from xformer_cli.export.huggingface import HF_LENGTH_PENALTY_SCALE, hidden_permutation
from xformer_cli.fileio import is_inside
from xformer_cli.languages import code_of_tag, is_tag, tag_for
from xformer_cli.importers.marian_files import (ACTIVATIONS, check_config, read_bytes, read_json, read_vocabulary,
                                                read_weights, resolve_source)
from xformer_cli.model.transformer import ModelConfig
from xformer_cli.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer


def import_marian(source: str, output: str | Path) -> Path:
    """Write ``source`` (a MarianMT directory or Hub id) as the xformer checkpoint ``output``;
    never inside ``source`` (the file written could be one of the model's)."""
    if not str(source).strip():  # Path("") is the working directory
        raise XformerError("give the MarianMT model to import: a directory or a Hub id (Helsinki-NLP/opus-mt-en-de)")
    if Path(source).is_dir() and is_inside(output, source):
        raise XformerError(f"{output} is inside the model being imported ({source}): write the checkpoint elsewhere")
    state = load_marian(source)
    save_checkpoint({k: v for k, v in state.items() if k not in ("format", "version")}, output)
    return Path(output)


def load_marian(source: str) -> dict[str, Any]:
    """The checkpoint state of a MarianMT directory or Hub id, as ``load_checkpoint`` returns
    one: "config", "tokenizer", "model" (and "imported_from")."""
    directory = resolve_source(str(source))
    hf = read_json(directory / "config.json")
    check_config(hf, directory / "config.json")
    vocab = _Vocabulary.read(directory, hf)
    weights, weights_path = read_weights(directory)
    marian = _MarianTensors(weights, hf, weights_path)
    cfg = Config(
        data=_data_config(directory, str(source), [piece for piece in vocab.src if is_tag(piece)]),
        tokenizer=TokenizerConfig(joint=False, vocab_size=len(vocab.src)),
        model=_model_config(hf, vocab.bos_id, bool(marian.final_logits_bias().any()), marian.one_embedding(vocab)),
        decode=_decode_config(directory, hf),
    )
    try:
        validate(cfg)
    except XformerError as exc:  # the settings were read from the model's files: name them
        raise XformerError(f"{directory}: its config.json, tokenizer_config.json and generation_config.json make "
                           f"no valid model: {exc}") from None
    tokenizer = Tokenizer(read_bytes(directory / "source.spm"), read_bytes(directory / "target.spm"),
                          vocab.src, None if vocab.shared else vocab.tgt,
                          names=(str(directory / "source.spm"), str(directory / "target.spm")))
    model = build_model(cfg, tokenizer)
    try:
        model.load_state_dict(_xformer_weights(marian, vocab, cfg.model))
    except RuntimeError as exc:
        raise XformerError(f"{weights_path}: the weights do not fit the model of config.json "
                           f"({str(exc)[:160]})") from None
    return {"format": FORMAT, "version": VERSION, "config": cfg.to_dict(), "tokenizer": tokenizer.state(),
            "model": model.state_dict(), "imported_from": str(source)}


# -- configuration ---------------------------------------------------------------------------

def _model_config(hf: dict, bos_id: int, logits_bias: bool, one_embedding: bool) -> ModelConfig:
    tie = bool(hf.get("tie_word_embeddings", True))
    return ModelConfig(
        d_model=hf["d_model"], d_ff=hf["encoder_ffn_dim"], n_heads=hf["encoder_attention_heads"],
        encoder_layers=hf["encoder_layers"], decoder_layers=hf["decoder_layers"],
        dropout=float(hf.get("dropout", 0.1)), attention_dropout=float(hf.get("attention_dropout", 0.0)),
        activation_dropout=float(hf.get("activation_dropout", 0.0)), pre_norm=_pre_norm(hf), tie_embeddings=tie,
        max_positions=int(hf.get("max_position_embeddings", 1024)),
        activation=ACTIVATIONS[hf.get("activation_function", "gelu")], final_logits_bias=logits_bias,
        scale_embedding=bool(hf.get("scale_embedding", False)),
        share_embeddings=one_embedding, bos_id=bos_id,
    )


def _pre_norm(hf: dict) -> bool:
    """Pegasus: Marian's layers normalised before each sub-layer, a LayerNorm after each stack."""
    return hf.get("model_type") == "pegasus"


IMPORTED_FROM = "imported-from:"  # the training corpus prefix of an imported model: it names no files


def _data_config(directory: Path, source: str, tags: list[str]) -> DataConfig:
    """The languages: those xformer's own export recorded (xformer_export.json), else
    tokenizer_config.json's source language and a target per tag of the vocabulary (a
    multilingual OPUS-MT model: >>fra<< -> fr), else its target language. No training data
    (a config must name a corpus: a placeholder prefix that says where the model came from)."""
    path = directory / "tokenizer_config.json"
    tok = read_json(path) if path.is_file() else {}
    defaults = DataConfig()
    placeholder = [CorpusConfig(prefix=f"{IMPORTED_FROM}{source}")]
    src_lang = str(tok.get("source_lang") or defaults.src_lang)
    recorded = export_languages(read_export_info(directory))
    if recorded is not None and recorded.tagged == bool(tags):
        return _pairs_config(recorded.pairs, dict(recorded.tags), placeholder)
    if tags:
        return _pairs_config([(src_lang, code_of_tag(tag)) for tag in tags], {code_of_tag(t): t for t in tags},
                             placeholder)
    return DataConfig(src_lang=src_lang, tgt_lang=str(tok.get("target_lang") or defaults.tgt_lang), train=placeholder)


def _pairs_config(pairs, tags: dict[str, str], train: list[CorpusConfig]) -> DataConfig:
    """A DataConfig of ``pairs`` whose tags are ``tags`` (data.lang_tags where xformer's own
    rule would name another; target_tag: source when there are tags)."""
    if len(pairs) == 1 and not tags:
        return DataConfig(src_lang=pairs[0][0], tgt_lang=pairs[0][1], train=train)
    overrides = {}
    for code, tag in tags.items():
        try:
            if tag_for(code) == tag:
                continue
        except XformerError:
            pass
        overrides[code] = tag
    return DataConfig(src_lang=pairs[0][0], tgt_lang=pairs[0][1], train=train,
                      pairs=[PairConfig(s, t) for s, t in pairs], target_tag="source" if tags else "none",
                      lang_tags=overrides)


def _decode_config(directory: Path, hf: dict) -> DecodeConfig:
    """xformer's decode defaults from generation_config.json (else config.json's keys); an
    xformer export's own decode section (xformer_export.json) for what generate cannot say."""
    path = directory / "generation_config.json"
    gen = {**hf, **(read_json(path) if path.is_file() else {})}
    try:
        return _generation_settings(directory, hf, gen)
    except (TypeError, ValueError) as exc:
        raise XformerError(f"{path if path.is_file() else directory / 'config.json'}: a generation setting "
                           f"(num_beams, max_length, length_penalty, ...) is not a number ({exc})") from None


def _generation_settings(directory: Path, hf: dict, gen: dict) -> DecodeConfig:
    defaults = DecodeConfig()
    # Pieces before eos at most: max_new_tokens counts eos, max_length also the start token.
    limit = int(gen["max_new_tokens"]) - 1 if gen.get("max_new_tokens") else (
        int(gen["max_length"]) - 2 if gen.get("max_length") else 0)
    positions = int(hf.get("max_position_embeddings", 1024))
    imported = DecodeConfig(
        beam_size=int(gen.get("num_beams") or 1),
        length_penalty=round(float(gen.get("length_penalty", 1.0)) / HF_LENGTH_PENALTY_SCALE, 4),
        max_len_a=0.0 if limit > 0 else defaults.max_len_a,
        max_len_b=limit if limit > 0 else defaults.max_len_b,
        min_len=int(gen.get("min_new_tokens") or defaults.min_len),
        max_input_len=positions - 1,  # + eos: Marian's position table cannot grow
    )
    return _as_exported(imported, read_export_info(directory).get("decode"), limit)


def _as_exported(imported: DecodeConfig, recorded: Any, limit: int) -> DecodeConfig:
    """An xformer export imported back: generate's one length limit is the longest source's, so
    where generation_config still says what the export wrote, the exported a * source + b,
    source cut and alphas per target come back instead (the round trip translates as before)."""
    from xformer_cli.export.huggingface import xformer_max_new_tokens

    if not isinstance(recorded, dict):
        return imported
    try:
        exported = DecodeConfig(**recorded)
        written = xformer_max_new_tokens(exported.max_input_len + 1, exported.max_len_a, exported.max_len_b) - 1
    except (TypeError, ValueError):  # an older or hand-edited file: generation_config alone
        return imported
    if limit != written or not 0 < exported.max_input_len <= imported.max_input_len:
        return imported
    return dataclasses.replace(imported, max_len_a=exported.max_len_a, max_len_b=exported.max_len_b,
                               max_input_len=exported.max_input_len,
                               length_penalty_by_target=dict(exported.length_penalty_by_target))


# -- vocabulary ------------------------------------------------------------------------------

class _Vocabulary:
    """Marian's pieces in xformer's order per side, and ``order[x]`` = the Marian id of xformer id x."""

    def __init__(self, src: list[str], tgt: list[str], src_order: list[int], tgt_order: list[int], bos_id: int,
                 shared: bool):
        self.src, self.tgt, self.src_order, self.tgt_order = src, tgt, src_order, tgt_order
        self.bos_id, self.shared = bos_id, shared

    @classmethod
    def read(cls, directory: Path, hf: dict) -> "_Vocabulary":
        tok_path = directory / "tokenizer_config.json"
        tok = read_json(tok_path) if tok_path.is_file() else {}
        src_size = int(hf.get("vocab_size", 58101))
        tgt_size = int(hf.get("decoder_vocab_size") or src_size)
        src_pieces = read_vocabulary(directory / "vocab.json", src_size, "vocab_size")
        shared = not tok.get("separate_vocabs", False)
        if shared and tgt_size != src_size:
            raise XformerError(f"{directory / 'config.json'}: decoder_vocab_size {tgt_size} differs from vocab_size "
                               f"{src_size}, but tokenizer_config.json has no separate_vocabs: true")
        tgt_pieces = (src_pieces if shared
                      else read_vocabulary(directory / "target_vocab.json", tgt_size, "decoder_vocab_size"))
        where = directory / "config.json"
        names = {role: _piece(tgt_pieces, hf.get(key), key, where) for role, key in
                 (("pad", "pad_token_id"), ("eos", "eos_token_id"), ("start", "decoder_start_token_id"))}
        names["unk"] = str(tok.get("unk_token") or "<unk>")
        if names["start"] in (names["eos"], names["unk"]):
            raise XformerError(f"{where}: decoder_start_token_id is the "
                               f"{'eos' if names['start'] == names['eos'] else 'unk'} token; "
                               "xformer cannot start the decoder with it")
        tgt_order = _order(tgt_pieces, names, directory / ("vocab.json" if shared else "target_vocab.json"))
        src_order = (tgt_order if shared
                     else _order(src_pieces, {**names, "start": names["pad"]}, directory / "vocab.json"))
        bos_id = PAD_ID if names["start"] == names["pad"] else BOS_ID
        return cls([src_pieces[i] for i in src_order], [tgt_pieces[i] for i in tgt_order], src_order, tgt_order,
                   bos_id, shared)


def _piece(pieces: list[str], i: Optional[int], key: str, where: Path) -> str:
    if not isinstance(i, int) or not 0 <= i < len(pieces):
        raise XformerError(f"{where}: {key} {i!r} is not an id of the vocabulary ({len(pieces)} pieces)")
    return pieces[i]


def _order(pieces: list[str], names: dict[str, str], where: Path) -> list[int]:
    """Marian ids in xformer's order: pad, unk, (start unless it is pad), eos at xformer's ids."""
    index = {piece: i for i, piece in enumerate(pieces)}
    if names["unk"] not in index:
        raise XformerError(f"{where}: has no unk piece {names['unk']!r} (tokenizer_config.json unk_token)")
    fixed = {PAD_ID: index[names["pad"]], UNK_ID: index[names["unk"]], EOS_ID: index[names["eos"]]}
    if names["start"] != names["pad"]:
        fixed[BOS_ID] = index[names["start"]]
    rest = iter(sorted(set(range(len(pieces))) - set(fixed.values())))
    return [fixed[x] if x in fixed else next(rest) for x in range(len(pieces))]


# -- weights ---------------------------------------------------------------------------------

_IGNORED = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")  # rebuilt, not stored


class _MarianTensors:
    """A MarianMT state dict, its shapes checked against config.json (one line naming the tensor)."""

    def __init__(self, weights: dict, hf: dict, where: Path):
        self.weights, self.hf, self.where = weights, hf, where
        # transformers ties the stack's embeddings to model.shared (and lm_head to the decoder's)
        # only with tie_word_embeddings; a file keeps the tied ones once, as model.shared.
        share = hf.get("share_encoder_decoder_embeddings", True)
        shared = ["model.shared.weight"] if share else []
        self.src_name = self._first(["model.encoder.embed_tokens.weight", *shared])
        self.tgt_name = self._first(["model.decoder.embed_tokens.weight", *shared])
        tied = hf.get("tie_word_embeddings", True)
        self.head_name = self.tgt_name if tied else self._first(["lm_head.weight"])
        self._check_shapes()

    def _first(self, names: list[str]) -> str:
        for name in names:
            if name in self.weights:
                return name
        raise XformerError(f"{self.where}: tensor {names[0]} is missing")

    def _expected(self) -> dict[str, tuple[int, ...]]:
        hf = self.hf
        d, ffn, src_v = hf["d_model"], hf["encoder_ffn_dim"], hf.get("vocab_size", 58101)
        tgt_v = hf.get("decoder_vocab_size") or src_v
        shapes: dict[str, tuple[int, ...]] = {self.src_name: (src_v, d), self.tgt_name: (tgt_v, d),
                                              self.head_name: (tgt_v, d)}
        if "final_logits_bias" in self.weights:
            shapes["final_logits_bias"] = (1, tgt_v)
        for side, count, attns in (("encoder", hf["encoder_layers"], ("self_attn",)),
                                   ("decoder", hf["decoder_layers"], ("self_attn", "encoder_attn"))):
            for i in range(count):
                p = f"model.{side}.layers.{i}"
                for attn in attns:
                    for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
                        shapes[f"{p}.{attn}.{proj}.weight"], shapes[f"{p}.{attn}.{proj}.bias"] = (d, d), (d,)
                for norm in (*(f"{a}_layer_norm" for a in attns), "final_layer_norm"):
                    shapes[f"{p}.{norm}.weight"] = shapes[f"{p}.{norm}.bias"] = (d,)
                shapes[f"{p}.fc1.weight"], shapes[f"{p}.fc1.bias"] = (ffn, d), (ffn,)
                shapes[f"{p}.fc2.weight"], shapes[f"{p}.fc2.bias"] = (d, ffn), (d,)
            if _pre_norm(hf):
                shapes[f"model.{side}.layer_norm.weight"] = shapes[f"model.{side}.layer_norm.bias"] = (d,)
        return shapes

    def _check_shapes(self) -> None:
        expected = self._expected()
        for name, shape in expected.items():
            if name not in self.weights:
                raise XformerError(f"{self.where}: tensor {name} is missing")
            if tuple(self.weights[name].shape) != shape:
                raise XformerError(f"{self.where}: tensor {name} has shape {tuple(self.weights[name].shape)}, "
                                   f"config.json gives {shape} (d_model, *_ffn_dim, *vocab_size)")
        allowed = set(expected) | set(_IGNORED) | {"model.shared.weight", "model.encoder.embed_tokens.weight",
                                                   "model.decoder.embed_tokens.weight", "lm_head.weight"}
        extra = sorted(set(self.weights) - allowed)
        if extra:
            raise XformerError(f"{self.where}: tensor {extra[0]} is not part of a MarianMT model xformer can import")

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.weights[name].to(torch.float32)

    def one_embedding(self, vocab: "_Vocabulary") -> bool:
        """Whether the encoder and decoder read one embedding matrix (what xformer then shares)."""
        return vocab.shared and (self.src_name == self.tgt_name
                                 or torch.equal(self[self.src_name], self[self.tgt_name]))

    def final_logits_bias(self) -> torch.Tensor:
        tgt_v = self.weights[self.tgt_name].shape[0]
        return self["final_logits_bias"].reshape(-1) if "final_logits_bias" in self.weights else torch.zeros(tgt_v)


def _xformer_weights(marian: _MarianTensors, vocab: _Vocabulary, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Marian's tensors under xformer's names, the hidden dimension and the ids in xformer's order."""
    inv = torch.argsort(hidden_permutation(cfg.d_model))  # xformer's hidden index -> Marian's
    out: dict[str, torch.Tensor] = {}
    src_order, tgt_order = torch.tensor(vocab.src_order), torch.tensor(vocab.tgt_order)
    out["src_embed.tokens.weight"] = marian[marian.src_name][src_order][:, inv]
    out["tgt_embed.tokens.weight"] = marian[marian.tgt_name][tgt_order][:, inv]
    out["generator.weight"] = marian[marian.head_name][tgt_order][:, inv]
    if cfg.final_logits_bias:
        out["logits_bias"] = marian.final_logits_bias()[tgt_order]

    def attention(x_name: str, m_name: str) -> None:
        out[f"{x_name}.q_proj.weight"], out[f"{x_name}.q_proj.bias"] = (
            marian[f"{m_name}.q_proj.weight"][:, inv], marian[f"{m_name}.q_proj.bias"])
        k, v = marian[f"{m_name}.k_proj.weight"][:, inv], marian[f"{m_name}.v_proj.weight"][:, inv]
        out[f"{x_name}.kv_proj.weight"] = torch.cat([k, v])
        out[f"{x_name}.kv_proj.bias"] = torch.cat([marian[f"{m_name}.k_proj.bias"], marian[f"{m_name}.v_proj.bias"]])
        out[f"{x_name}.out_proj.weight"], out[f"{x_name}.out_proj.bias"] = (
            marian[f"{m_name}.out_proj.weight"][inv], marian[f"{m_name}.out_proj.bias"][inv])

    def norm(x_name: str, m_name: str) -> None:
        out[f"{x_name}.weight"], out[f"{x_name}.bias"] = marian[f"{m_name}.weight"][inv], marian[f"{m_name}.bias"][inv]

    def ffn(x_name: str, m_name: str) -> None:
        out[f"{x_name}.w1.weight"], out[f"{x_name}.w1.bias"] = (
            marian[f"{m_name}.fc1.weight"][:, inv], marian[f"{m_name}.fc1.bias"])
        out[f"{x_name}.w2.weight"], out[f"{x_name}.w2.bias"] = (
            marian[f"{m_name}.fc2.weight"][inv], marian[f"{m_name}.fc2.bias"][inv])

    for i in range(cfg.encoder_layers):
        x, m = f"encoder_layers.{i}", f"model.encoder.layers.{i}"
        attention(f"{x}.self_attn", f"{m}.self_attn")
        norm(f"{x}.sub_attn.norm", f"{m}.self_attn_layer_norm")
        ffn(f"{x}.ffn", m)
        norm(f"{x}.sub_ffn.norm", f"{m}.final_layer_norm")
    for i in range(cfg.decoder_layers):
        x, m = f"decoder_layers.{i}", f"model.decoder.layers.{i}"
        attention(f"{x}.self_attn", f"{m}.self_attn")
        norm(f"{x}.sub_self.norm", f"{m}.self_attn_layer_norm")
        attention(f"{x}.cross_attn", f"{m}.encoder_attn")
        norm(f"{x}.sub_cross.norm", f"{m}.encoder_attn_layer_norm")
        ffn(f"{x}.ffn", m)
        norm(f"{x}.sub_ffn.norm", f"{m}.final_layer_norm")
    if cfg.pre_norm:
        norm("encoder_norm", "model.encoder.layer_norm")
        norm("decoder_norm", "model.decoder.layer_norm")
    return out
