"""The passes after the training loop, on rank 0 alone (the process group is gone by then):
checkpoint averaging (train.average_last) and the length-penalty search on the valid set
(train.tune_length_penalty)."""

from __future__ import annotations

import contextlib
import time
from typing import Iterator

import torch

from xformer_cli.checkpoint import checkpoint_step, kept_checkpoints, load_checkpoint, save_checkpoint
from xformer_cli.train import checkpointing
from xformer_cli.train.average import average_checkpoints
from xformer_cli.train.state import RunState
from xformer_cli.train.tune import pick_length_penalty
from xformer_cli.train.validation import score_valid


@contextlib.contextmanager
def other_weights(model: torch.nn.Module, weights: dict) -> Iterator[None]:
    """``model`` holds ``weights`` inside the block and its own weights again after it."""
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(weights)
    try:
        yield
    finally:
        model.load_state_dict(trained)


def average_last(run: RunState) -> None:
    """train.average_last: average the newest step checkpoints (the paper's checkpoint
    averaging), validate the mean, and make it best.pt when its BLEU is higher. last.pt
    keeps the trained weights, so resuming is unaffected."""
    run_dir = run.run_dir
    kept = kept_checkpoints(run_dir)[-run.config.train.average_last:]
    if len(kept) < 2 or run.valid is None:
        run.log(f"average_last: {len(kept)} step checkpoint(s) kept, nothing to average")
        return
    averaged = average_checkpoints(kept, run_dir / "average.pt")
    steps = [checkpoint_step(p) for p in kept]
    # Saved inside the block: a state dict shares the parameters' storage, which the
    # trained weights overwrite on the way out.
    with other_weights(run.model, averaged["model"]):
        loss, ppl, score = score_valid(run)
        best = run.counters.best_bleu
        better = best is None or score > best
        run.log(f"average of steps {', '.join(map(str, steps))}: valid loss {loss:.3f} ppl {ppl:.2f} BLEU {score:.2f}"
                    f" ({'better than' if better else 'not above'} best {best or 0:.2f})")
        run.metrics.record(run.event(precision=run.precision, averaged_steps=steps, valid_loss=round(loss, 4),
                                     valid_ppl=round(ppl, 3), valid_bleu=round(score, 2)))
        if better:
            run.counters.best_bleu = score
            save_checkpoint({**checkpointing.state(run), "averaged_steps": steps}, run_dir / "best.pt")


def tune_length_penalty(run: RunState) -> None:
    """train.tune_length_penalty: decode the valid set with best.pt's weights at each alpha
    (beam decode.beam_size, the precision validation uses) and write the best alpha into
    best.pt's decode.length_penalty; the run's config.yaml and last.pt stay as they were."""
    alphas = run.config.train.tune_length_penalty
    path = run.run_dir / "best.pt"
    best = load_checkpoint(path)
    beam = run.config.decode.beam_size
    corpus = run.valid.corpus
    started = time.time()
    with other_weights(run.model, best["model"]):
        run.model.eval()
        translator = run.valid_engine()
        alpha, scores = pick_length_penalty(
            lambda a: translator.translate(corpus.src, beam_size=beam, length_penalty=a), corpus.tgt, alphas)
        run.model.train()
    best["config"]["decode"]["length_penalty"] = alpha
    best["length_penalty_scores"] = scores
    save_checkpoint(best, path)
    run.log(f"length penalty: valid BLEU (beam {beam}) "
                + ", ".join(f"{a:g}: {s:.2f}" for a, s in scores.items())
                + f" -> {alpha:g} in best.pt (decode.length_penalty; {time.time() - started:.0f} s)")
    run.metrics.record(run.event(length_penalty=alpha,
                                 length_penalty_valid_bleu={f"{a:g}": round(s, 2) for a, s in scores.items()}))
