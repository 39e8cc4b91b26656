"""The passes after the training loop, on rank 0 alone (the process group is gone by then):
checkpoint averaging (train.average_last) and the length-penalty search on the valid set
(train.tune_length_penalty). When they finish, a metrics.jsonl row says so (``DONE``): a run
stopped inside them, its last.pt already at its last step, runs them when resumed (``owed``)."""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Iterator

import torch

from xformer_cli.checkpoint_file import checkpoint_step, kept_checkpoints, load_checkpoint, save_checkpoint
from xformer_cli.train import run_checkpoints
from xformer_cli.textio import complete_rows
from xformer_cli.train.average import average_checkpoints
from xformer_cli.train.state import RunState
from xformer_cli.evaluate import bleu
from xformer_cli.train.tune import alphas_by_target, best_alpha
from xformer_cli.train.validation import score_valid, translate_shares


DONE = "after_training"  # the metrics.jsonl key of the row that marks the passes finished
PASS_KEYS = ("averaged_steps", "length_penalty")  # the keys of the rows the passes log


def owed(run: RunState) -> bool:
    """Whether the run, at its last step, still owes its passes: it asks for one, and no row of
    metrics.jsonl marks them finished at this step (a kill or Ctrl-C inside them would otherwise
    leave best.pt unaveraged and its length penalty untuned for good)."""
    tc = run.config.train
    if not (tc.average_last or tc.tune_length_penalty):
        return False
    step = run.counters.step
    try:
        rows = complete_rows(run.run_dir / "metrics.jsonl")
    except OSError:
        return True
    return not any(row.get(DONE) and row.get("step") == step for _, row in rows)


def validated_at(run: RunState, step: int) -> bool:
    """Whether metrics.jsonl holds the validation of ``step`` (a run interrupted in its last step
    saved last.pt there without one: best.pt may not even exist)."""
    try:
        rows = complete_rows(run.run_dir / "metrics.jsonl")
    except OSError:
        return False
    return any(row.get("step") == step and "valid_loss" in row and not any(key in row for key in PASS_KEYS)
               for _, row in rows)


def forget_unfinished(run: RunState) -> None:
    """Before owed passes run again: drop the rows the stopped ones logged at this step, so
    metrics.jsonl holds one averaging row and one length-penalty row for it."""
    step = run.counters.step
    run.metrics.keep(lambda row: not (row.get("step") == step and any(key in row for key in PASS_KEYS)))


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
    averaging), validate the mean, and make it best.pt when its BLEU (the mean over the
    directions) is higher. last.pt keeps the trained weights, so resuming is unaffected."""
    run_dir = run.run_dir
    kept = kept_checkpoints(run_dir)[-run.config.train.average_last:]
    if len(kept) < 2 or not run.valid:
        run.log(f"average_last: {len(kept)} step checkpoint(s) kept, nothing to average")
        return
    averaged = average_checkpoints(kept, run_dir / "average.pt")
    steps = [checkpoint_step(p) for p in kept]
    # Saved inside the block: a state dict shares the parameters' storage, which the
    # trained weights overwrite on the way out.
    with other_weights(run.model, averaged["model"]):
        scores = score_valid(run)
        best = run.counters.best_bleu
        better = best is None or scores.bleu > best
        run.log(f"average of steps {', '.join(map(str, steps))}: {scores.describe()}"
                f" ({'better than' if better else 'not above'} best {best or 0:.2f})")
        run.metrics.record(run.event(precision=run.precision, averaged_steps=steps, **scores.figures()))
        if better:
            run.counters.best_bleu = scores.bleu
            save_checkpoint({**run_checkpoints.state(run), "averaged_steps": steps}, run_dir / "best.pt")


def tune_length_penalty(run: RunState) -> None:
    """train.tune_length_penalty: decode every direction's valid set with best.pt's weights at
    each alpha (beam decode.beam_size, the precision validation uses; on rank 0 alone, as every
    pass after the loop)
    and write the alpha with the best mean BLEU into best.pt's decode.length_penalty, and with
    train.length_penalty_by_target each target's own into decode.length_penalty_by_target;
    the run's config.yaml and last.pt stay as they were."""
    alphas = run.config.train.tune_length_penalty
    path = run.run_dir / "best.pt"
    best = load_checkpoint(path)
    beam = run.config.decode.beam_size
    started = time.time()
    with other_weights(run.model, best["model"]):
        results = {alpha: {v.direction: bleu(hyps, v.corpus.tgt)
                           for v, hyps in zip(run.valid, translate_shares(run, beam, length_penalty=alpha))}
                   for alpha in alphas}
    scores = {alpha: {d: result.score for d, result in by.items()} for alpha, by in results.items()}
    # How long each alpha writes against valid's references: a valid set whose references run
    # longer than the test set's pulls the pick to an alpha that writes the test set too long.
    ratios = {alpha: statistics.fmean(result.length_ratio or 0.0 for result in by.values())
              for alpha, by in results.items()}
    directions = [v.direction for v in run.valid]
    alpha = best_alpha(scores, directions)
    by_target = alphas_by_target(scores) if run.config.train.length_penalty_by_target and len(
        {t for _, t in directions}) > 1 else {}
    best["config"]["decode"]["length_penalty"] = alpha
    best["config"]["decode"]["length_penalty_by_target"] = by_target
    means = {a: statistics.fmean(by_direction.values()) for a, by_direction in scores.items()}
    best["length_penalty_scores"] = means
    if len(directions) > 1:
        best["length_penalty_scores_by_direction"] = {a: {f"{s}-{t}": v for (s, t), v in by.items()}
                                                      for a, by in scores.items()}
    save_checkpoint(best, path)
    _log_length_penalty(run, scores, ratios, alpha, by_target, beam, time.time() - started)


def _log_length_penalty(run: RunState, scores: dict, ratios: dict[float, float], alpha: float,
                        by_target: dict[str, float], beam: int, seconds: float) -> None:
    means = {a: statistics.fmean(by_direction.values()) for a, by_direction in scores.items()}
    several = len(next(iter(scores.values()))) > 1
    run.log(f"length penalty: valid BLEU (beam {beam}{', mean of the directions' if several else ''}) "
            + ", ".join(f"{a:g}: {s:.2f} (length {ratios[a]:.3f})" for a, s in means.items())
            + f" -> {alpha:g} in best.pt (decode.length_penalty; {seconds:.0f} s)")
    entry = run.event(length_penalty=alpha, length_penalty_valid_bleu={f"{a:g}": round(s, 2) for a, s in means.items()},
                      length_penalty_valid_length_ratio={f"{a:g}": round(r, 4) for a, r in ratios.items()})
    if several:
        for (source, target) in next(iter(scores.values())):
            run.log(f"  {source}-{target}: "
                    + ", ".join(f"{a:g}: {by[(source, target)]:.2f}" for a, by in scores.items()))
        entry["directions"] = {f"{s}-{t}": {"length_penalty_valid_bleu": {f"{a:g}": round(by[(s, t)], 2)
                                                                          for a, by in scores.items()}}
                               for s, t in next(iter(scores.values()))}
    if by_target:
        run.log("length penalty by target language: " + ", ".join(f"{t} {a:g}" for t, a in by_target.items())
                + " in best.pt (decode.length_penalty_by_target)")
        entry["length_penalty_by_target"] = by_target
    run.metrics.record(entry)
