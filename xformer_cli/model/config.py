"""The model's hyper-parameters, apart from the model: ``config.py`` reads and checks the
``model`` section without importing torch (``model/transformer.py`` builds the network from it
and re-exports ``ModelConfig``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

# The FFN's activations by name (swish and silu are one function); model/transformer.py maps
# each to its torch function.
ACTIVATION_NAMES = ("relu", "swish", "silu", "gelu")


@dataclass
class ModelConfig:
    """Architecture hyper-parameters; the defaults are the paper's base model. The config's
    ``model`` section is this class; vocabulary sizes come from the tokenizer."""

    d_model: int = 512
    d_ff: int = 2048
    n_heads: int = 8
    encoder_layers: int = 6
    decoder_layers: int = 6
    dropout: float = 0.1  # residual + embedding dropout (section 5.4)
    attention_dropout: float = 0.0  # on attention weights (tensor2tensor habit; not in the paper)
    activation_dropout: float = 0.0  # inside the FFN, after the ReLU
    pre_norm: bool = False  # False = post-norm as in the paper
    tie_embeddings: bool = True  # share src/tgt embeddings and the pre-softmax matrix (3.4)
    max_positions: int = 1024
    # Options an imported MarianMT model needs (``importers/marian.py``); the defaults are the
    # paper's model, and a checkpoint written before they existed reads them as the defaults.
    activation: str = "relu"  # the FFN's: relu, swish (= silu) or gelu
    final_logits_bias: bool = False  # a fixed (not trained) bias added to the logits, as Marian's
    scale_embedding: bool = True  # token embeddings times sqrt(d_model) (3.4)
    share_embeddings: Optional[bool] = None  # one source/target embedding matrix; None: as tie_embeddings
    bos_id: int = 2  # the decoder's start token (tokenizer.BOS_ID; Marian starts with pad, 0)
    # The output layer scores the pieces the training data's target side uses, not the whole
    # (joint) vocabulary: fewer products and loss passes, smoothing spread over real targets.
    restrict_output: bool = False
    # How many pieces the output layer scores: the target side's (``output_pieces``, counted in
    # the training data by the trainer when ``restrict_output`` asks for it); 0 = all of them.
    output_pieces: int = 0
