"""Pictures of a run: the training report and attention heatmaps (matplotlib, optional).

matplotlib is an optional extra (``pip install 'xformer[plot]'``); without it these
functions raise an ``XformerError`` that says so, which the CLI prints as one line.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Sequence

from xformer_cli.errors import XformerError
from xformer_cli.fileio import atomic_file, unchanged_or, unwritable_folder, writing

REPORT_SIZE = (15.0, 8.0)  # inches at REPORT_DPI: a 1500 x 800 PNG
REPORT_DPI = 100


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        raise XformerError("plots need matplotlib: pip install 'xformer[plot]'") from None
    return plt


def read_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise XformerError(f"no metrics.jsonl in {run_dir}: is it a run directory written by xformer train?")
    rows = []
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")  # the last: after the last newline
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):  # no newline after it: a run killed while it logged (train cuts it on resume)
                continue
            raise XformerError(f"{path}:{number}: not a JSON line") from None
        if not isinstance(row, dict):
            raise XformerError(f"{path}:{number}: not a JSON object")
        _check_row(row, f"{path}:{number}")
        rows.append(row)
    if not rows:
        raise XformerError(f"{path} is empty: the run has not logged anything yet")
    return rows


# What the report reads of each kind of row (train writes them all): a row it draws lacks none.
_ROW_KEYS = {"train_loss": ("training", ("step", "minutes", "train_loss", "lr", "tokens_per_s")),
             "averaged_steps": ("averaging", ("step", "minutes", "valid_loss", "valid_bleu")),
             "valid_loss": ("validation", ("step", "minutes", "valid_loss", "valid_ppl", "valid_bleu"))}


def _check_row(row: dict, where: str) -> None:
    """One line naming the line and the key, instead of a KeyError or a plot of strings."""
    if not _is_number(row.get("step")):  # every row train writes says where the run was
        raise XformerError(f"{where}: a row without a number for 'step'")
    if "minutes" in row and not _is_number(row["minutes"]):  # the summary prints the last row's
        raise XformerError(f"{where}: 'minutes' is not a number")
    for marker, (kind, keys) in _ROW_KEYS.items():
        if marker not in row:
            continue
        for key in keys:
            if not _is_number(row.get(key)):
                raise XformerError(f"{where}: a {kind} row without a number for '{key}'")
        if kind == "averaging" and not (isinstance(row["averaged_steps"], list) and row["averaged_steps"]):
            raise XformerError(f"{where}: an averaging row without the list of its 'averaged_steps'")
        directions = row.get("directions", {})
        if not isinstance(directions, dict) or not all(
                isinstance(figures, dict) and _is_number(figures.get("valid_bleu")) for figures in directions.values()):
            raise XformerError(f"{where}: 'directions' is not each direction's figures with its 'valid_bleu'")
        return


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def summarize(rows: Sequence[dict]) -> str:
    """A few lines a person can read in the terminal."""
    train = [r for r in rows if "train_loss" in r]
    valid = [r for r in rows if "valid_loss" in r and "averaged_steps" not in r]
    averaged = [r for r in rows if "averaged_steps" in r]
    last = rows[-1]
    lines = [f"steps: {last.get('step', 0)}  epochs: {last.get('epoch', 0)}  minutes: {last.get('minutes', 0):.1f}"]
    if train:
        rate = statistics.median(r["tokens_per_s"] for r in train)
        lines.append(f"train loss: {train[0]['train_loss']:.3f} at step {train[0]['step']} -> "
                     f"{train[-1]['train_loss']:.3f} at step {train[-1]['step']}; median {rate:.0f} target tokens/s")
    if valid:
        best = max(valid, key=lambda r: r.get("valid_bleu", float("-inf")))
        lines.append(f"valid: loss {valid[-1]['valid_loss']:.3f}, ppl {valid[-1]['valid_ppl']:.2f}, "
                     f"BLEU {valid[-1]['valid_bleu']:.2f} at step {valid[-1]['step']}; "
                     f"best BLEU {best['valid_bleu']:.2f} at step {best['step']}")
    if valid and valid[-1].get("directions"):
        lines.append("valid BLEU by direction (mean above): " + ", ".join(
            f"{name} {figures['valid_bleu']:.2f}" for name, figures in valid[-1]["directions"].items()))
    for r in averaged:
        lines.append(f"average of {len(r['averaged_steps'])} checkpoints (steps {r['averaged_steps'][0]}-"
                     f"{r['averaged_steps'][-1]}): valid loss {r['valid_loss']:.3f}, BLEU {r['valid_bleu']:.2f}")
    return "\n".join(lines)


def plot_report(run_dir: str | Path, output: str | Path) -> str:
    """Losses, validation BLEU and learning rate against steps (top) and minutes (bottom); the
    averaged checkpoint's validation is a marker of its own, not a point on the run's line. A
    multilingual run's BLEU panel has a line per direction and their mean."""
    plt = _pyplot()
    rows = read_metrics(run_dir)
    train = [r for r in rows if "train_loss" in r]
    valid = [r for r in rows if "valid_loss" in r and "averaged_steps" not in r]
    averaged = [r for r in rows if "averaged_steps" in r]
    fig, axes = plt.subplots(2, 3, figsize=REPORT_SIZE, dpi=REPORT_DPI)
    for row, x_key, x_label in ((0, "step", "step"), (1, "minutes", "wall time (minutes)")):
        loss_ax, bleu_ax, lr_ax = axes[row]
        loss_ax.plot([r[x_key] for r in train], [r["train_loss"] for r in train], label="train (label-smoothed)")
        if valid:  # no empty curve in the legend of a run that has not validated yet
            loss_ax.plot([r[x_key] for r in valid], [r["valid_loss"] for r in valid], "o-",
                         label="valid (label-smoothed)")
            _plot_bleu(bleu_ax, valid, x_key)
        else:
            bleu_ax.text(0.5, 0.5, "no validation yet", ha="center", va="center", transform=bleu_ax.transAxes)
            bleu_ax.set_xticks([])
            bleu_ax.set_yticks([])
        loss_ax.set_ylabel("loss per target token")
        for r in averaged:
            label = f"average of {len(r['averaged_steps'])} checkpoints"
            loss_ax.plot([r[x_key]], [r["valid_loss"]], "*", color="tab:purple", markersize=14, label=label)
            bleu_ax.plot([r[x_key]], [r["valid_bleu"]], "*", color="tab:purple", markersize=14, label=label)
        loss_ax.legend()
        if averaged or _directions(valid):
            bleu_ax.legend(fontsize=8)
        bleu_ax.set_ylabel("valid sacreBLEU")
        lr_ax.plot([r[x_key] for r in train], [r["lr"] for r in train], color="tab:red")
        lr_ax.set_ylabel("learning rate")
        for ax in (loss_ax, bleu_ax, lr_ax):
            ax.set_xlabel(x_label)
            ax.grid(alpha=0.3)
    fig.suptitle(f"xformer run {Path(run_dir).resolve().name}")
    fig.tight_layout()
    _save(fig, output)
    plt.close(fig)
    return summarize(rows)


def _directions(valid: Sequence[dict]) -> list[str]:
    """The directions a multilingual run validated ("en-de", ...), in their order; [] for a bilingual run."""
    return list(dict.fromkeys(name for r in valid for name in r.get("directions", {})))


def _plot_bleu(ax, valid: Sequence[dict], x_key: str) -> None:
    """Validation BLEU: one line, or with several directions one thin line each and their mean
    (the figure best.pt is picked by) thick."""
    directions = _directions(valid)
    for name in directions:
        rows = [r for r in valid if name in r.get("directions", {})]
        ax.plot([r[x_key] for r in rows], [r["directions"][name]["valid_bleu"] for r in rows], ".-", linewidth=1,
                label=name.replace("-", "->"))
    ax.plot([r[x_key] for r in valid], [r["valid_bleu"] for r in valid], "o-", linewidth=2.5,
            color="black" if directions else "tab:green",  # the directions take the colour cycle
            label="mean of the directions" if directions else "valid, as trained")


def plot_attention(maps: Sequence, output: str | Path, per_head: bool = False) -> None:
    """One heatmap per (sentence, layer), averaged over heads, or one per head with ``per_head``."""
    plt = _pyplot()
    if not maps:
        raise XformerError("nothing to plot: every input line was empty")
    panels = []  # (title, weights (T, S), source, target)
    for n, m in enumerate(maps, start=1):
        layers, heads = m.weights.shape[:2]
        for layer in range(layers):
            if per_head:
                panels += [(f"sentence {n}, layer {layer + 1}, head {h + 1}", m.weights[layer, h], m.source, m.target)
                           for h in range(heads)]
            else:
                panels.append((f"sentence {n}, layer {layer + 1}, mean of {heads} heads", m.weights[layer].mean(0),
                               m.source, m.target))
    cols = maps[0].weights.shape[1] if per_head else maps[0].weights.shape[0]
    rows = (len(panels) + cols - 1) // cols
    longest = max(max(len(m.source), len(m.target)) for m in maps)
    side = max(3.0, 0.28 * longest + 1.5)  # room for one label per piece
    fig, axes = plt.subplots(rows, cols, figsize=(side * cols, side * rows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax, (title, weights, source, target) in zip(axes.flat, panels):
        ax.imshow(weights.numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_xticks(range(len(source)), source, rotation=90, fontsize=8)
        ax.set_yticks(range(len(target)), target, fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("source")
        ax.set_ylabel("output")
    fig.tight_layout()
    _save(fig, output)
    plt.close(fig)


def check_png_path(output: str | Path) -> Path:
    """``output`` as a path a plot can be written to, or one line saying why not."""
    output = Path(output)
    if output.suffix.lower() != ".png":
        raise XformerError(f"{output}: plots are written as PNG; give a .png path")
    if not output.parent.is_dir():
        raise XformerError(f"{output}: folder {output.parent} does not exist")
    why = unwritable_folder(output.parent)
    if why is not None:
        raise XformerError(f"cannot write {output}: {why}")
    return output


def _save(fig, output: str | Path) -> None:
    """Written beside ``output`` and renamed into place: a failed or interrupted write (a full
    disk, Ctrl-C) leaves the earlier plot whole, and says so in one line."""
    path = check_png_path(output)
    intact = unchanged_or(path, "no partial file was left")
    try:
        with writing(path, intact=intact), atomic_file(path, "wb") as handle:
            fig.savefig(handle, format="png")
    except OSError as exc:  # a file size limit, an I/O error (a full disk is writing's line)
        raise XformerError(f"cannot write {path}: {exc.strerror or exc}; {intact}") from None
