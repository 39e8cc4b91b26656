"""The one place a translation engine is built: (model path(s), engine, precision, device,
threads) -> an ``Engine``, with one device rule and one threads rule. ``xformer translate``,
``eval-bleu``, ``serve`` and the trainer's validation (``engine_for_model``) all come here.

    from xformer_cli.decode.factory import load_engine
    engine = load_engine("runs/multi30k/best.pt")            # engine, precision, device: auto
    engine.translate(["A man rides a bike."], beam_size=5)

Engines: ``xformer`` (PyTorch, ``decode/translator.py``: a checkpoint, or several as an
ensemble) and ``ctranslate2`` (``decode/ct2_engine.py``: a directory written by ``xformer
export``, or a checkpoint exported at start).

Precision, one list for both engines: ``fp32``, ``bf16`` and ``fp16`` (either engine), ``int8`` (the
CTranslate2 engine, int8 weights), or any other CTranslate2 compute type (``int8_float32``,
``int8_bfloat16``, ``float16``, ...), which selects the CTranslate2 engine. ``auto`` (the
default) picks the engine too (``auto_choice``): the fastest engine whose BLEU stays within
0.2 of PyTorch fp32. On CUDA PyTorch with the compute capability's weights (bf16 from 8.0, fp16
on 7.x, fp32 before); on a CPU with AMX or without bf16, CTranslate2 float32 unless the caller
wants what only xformer does (its beam search included: it ranks and stops otherwise than
xformer's GNMT search; greedy output is fp32's); else PyTorch bf16 on CPUs that compute bf16,
fp32 on the others.

Device (``engine_device``): ``auto`` is CUDA when the chosen engine's own runtime sees a GPU
(torch for xformer, CTranslate2 for ctranslate2), else the CPU.

Threads (``decode_threads``): what is asked for, else $OMP_NUM_THREADS, else every core; one
fewer for PyTorch when its OpenMP threads spin at barriers (the CLI makes them sleep:
``prefer_passive_waits``), and ``serve`` leaves one core to HTTP. CTranslate2 on a CPU runs
them as parallel batches, one thread each (``decode/ct2_engine.py``, the note on CPU threads).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Optional, Sequence

from xformer_cli.cpu_cores import available_cores, too_many_threads
from xformer_cli.errors import XformerError
from xformer_cli.export.format import is_export_directory
from xformer_cli.precisions import DECODE_PRECISIONS, ENGINES, TORCH_DECODE_PRECISIONS

if TYPE_CHECKING:  # the engines import torch; this module must not, so the CLI can set OpenMP up first
    import torch

    from xformer_cli.config import DecodeConfig
    from xformer_cli.decode.engine import Engine
    from xformer_cli.languages import Languages
    from xformer_cli.model.transformer import Transformer
    from xformer_cli.tokenizer import Tokenizer

# xformer's precision names in CTranslate2's terms; any other name goes to CTranslate2 as is.
CT2_COMPUTE_TYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "int8": "int8"}
# What a request may need that only the xformer engine offers (CTranslate2Translator.unsupported
# and the rest): with any of them, precision auto stays on PyTorch.
# "beam_search": xformer's GNMT-exact beam search (CTranslate2's ranks and stops otherwise and
# lost BLEU against it: docs/benchmarks/decoding.md, "Choosing the engine").
# Each need, as the log line names it.
XFORMER_ONLY_WORDS = {"ensemble": "an ensemble",
                      "attention": "attention weights (--attention, HTML tags, glossaries, --keep-numbers)",
                      "sampling_topk": "top-k sampling", "temperature": "a sampling temperature",
                      "seed": "a sampling seed", "use_cache": "decoding without the cache",
                      "beam_search": "xformer's beam search (CTranslate2's ranks and stops otherwise)"}
XFORMER_ONLY = tuple(XFORMER_ONLY_WORDS)

Log = Callable[[str], None]


@dataclass(frozen=True)
class EngineChoice:
    """What ``load_engine`` builds, and why."""

    engine: str  # xformer | ctranslate2
    precision: str  # xformer: fp32 | bf16 | fp16; ctranslate2: its compute type ("default": the export's weights)
    device: str  # xformer: a torch device; ctranslate2: cpu | cuda | cuda:N
    why: str

    def describe(self, requested: str = "auto") -> str:
        """The log line: what was chosen, and for precision auto why."""
        chosen = f"{self.engine} {self.precision} on {self.device}"
        if requested == "auto":
            return f"precision: auto -> {chosen} ({self.why})"
        return f"precision: {chosen} ({self.why})"


# -- the rules ---------------------------------------------------------------------------------

def ctranslate2_installed() -> bool:
    return importlib.util.find_spec("ctranslate2") is not None


def ctranslate2_gpus() -> int:
    """GPUs CTranslate2 sees; 0 when it is not installed (tests replace this function)."""
    if not ctranslate2_installed():
        return 0
    import ctranslate2

    return int(ctranslate2.get_cuda_device_count())


def auto_choice(flags: Iterable[str], ct2_available: bool, blockers: Sequence[str] = ()) -> tuple[str, str, str]:
    """``--precision auto`` on a CPU with ``flags``: (engine, precision, why).

    The fastest engine whose BLEU stays within 0.2 of PyTorch fp32 (docs/benchmarks/decoding.md, "Choosing
    the engine"). CTranslate2 float32 where nothing only PyTorch does is asked for (``blockers``:
    ``beam_search`` for a caller that wants xformer's beam search, whose output training's
    validation scored): its greedy output is fp32's, and since it runs parallel batches it is the
    faster engine on AMX too. Else PyTorch bf16 where the CPU computes bf16 (AMX, AVX512-BF16:
    well within that margin), fp32 elsewhere. On AVX512-BF16 without AMX PyTorch bf16 stays: there it
    was faster than CTranslate2's one batch, and CTranslate2's beam search lost more than 0.2 BLEU."""
    from xformer_cli.device import torch_cpu_precision

    flags = frozenset(flags)
    torch_precision, torch_why = torch_cpu_precision(flags)
    amx = "amx_bf16" in flags
    if torch_precision == "bf16" and not amx:
        return "xformer", "bf16", f"{torch_why}; CTranslate2's beam search lost more than 0.2 BLEU"
    if blockers:
        wanted = ", ".join(XFORMER_ONLY_WORDS.get(blocker, blocker) for blocker in blockers)
        return "xformer", torch_precision, f"{torch_why}; asked for what only xformer has: {wanted}"
    if not ct2_available:
        return "xformer", torch_precision, f"{torch_why}; pip install 'xformer[ctranslate2]' for faster greedy search"
    where = ("AMX: CTranslate2 float32 in parallel batches is faster than PyTorch bf16" if amx
             else "a CPU without bf16: CTranslate2 float32 is faster")
    return "ctranslate2", "float32", f"{where} (greedy: fp32's output; its beam search ranks otherwise)"


def engine_device(engine: str, device: str = "auto") -> str:
    """The one device rule: ``auto`` is CUDA when the engine's own runtime sees a GPU (torch for
    xformer, CTranslate2 for ctranslate2), else the CPU; a named device is checked."""
    from xformer_cli.device import pick_device

    if engine == "xformer":
        return str(pick_device(device))
    if device == "cpu":
        return "cpu"
    gpus = ctranslate2_gpus()
    if device == "auto":
        return "cuda" if gpus else "cpu"
    kind, _, index = device.partition(":")
    if kind != "cuda" or not (index == "" or index.isdigit()):
        raise XformerError(f"--device must be auto, cpu, cuda or cuda:N, not {device!r}")
    if int(index or 0) >= gpus:
        raise XformerError(f"device '{device}' was asked for but CTranslate2 sees {gpus} GPU(s)")
    return device


def decode_threads(requested: int = 0, engine: str = "xformer", serving: bool = False) -> int:
    """CPU threads for an engine: ``requested`` when > 0, else $OMP_NUM_THREADS when set, else
    every core, one fewer for PyTorch when its OpenMP threads spin rather than sleep at a
    barrier (``torch_waits_passive``), and one fewer when ``serving`` (that core runs HTTP).
    Spinning torch threads on a machine that runs anything else wait for each other's time
    slices: on two shared cores two of them were slower than one thread, two sleeping ones
    faster (docs/benchmarks/decoding.md, "Threads")."""
    if requested < 0:
        raise XformerError(f"--threads must be >= 0 (0 = every core), not {requested}")
    refused = too_many_threads(requested, "--threads")
    if refused:
        raise XformerError(refused)
    if requested > 0:
        return requested
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        refused = too_many_threads(int(env), "$OMP_NUM_THREADS")
        if refused:
            raise XformerError(refused)
        return int(env)
    spinning = engine == "xformer" and not torch_waits_passive()
    return max(1, available_cores() - int(spinning) - int(serving))


_passive_set_here = False  # whether prefer_passive_waits set OMP_WAIT_POLICY (not the user)


def prefer_passive_waits() -> None:
    """torch's OpenMP threads sleep rather than spin at a barrier, unless $OMP_WAIT_POLICY says
    otherwise. OpenMP reads it once, as it loads: the CLI calls this before torch is imported."""
    global _passive_set_here
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        _passive_set_here = True


def torch_waits_passive() -> bool:
    return _passive_set_here or os.environ.get("OMP_WAIT_POLICY", "").strip().upper() == "PASSIVE"


def _default_waits_for_ctranslate2() -> None:
    """CTranslate2 loads an OpenMP of its own, which reads $OMP_WAIT_POLICY as it loads. Sleeping
    waits made it slower on a quiet machine (they help PyTorch everywhere), so unless the user
    set the policy, CTranslate2 gets OpenMP's default (spin a while, then sleep)."""
    import sys

    if _passive_set_here and "ctranslate2" not in sys.modules:
        os.environ.pop("OMP_WAIT_POLICY", None)


# -- choosing ------------------------------------------------------------------------------------

def choose_engine(paths: Sequence[Path], engine: str = "auto", precision: str = "auto", device: str = "auto",
                  needs: Iterable[str] = (), flags: Optional[Iterable[str]] = None) -> EngineChoice:
    """What ``load_engine`` will build; ``flags`` overrides the CPU's (tests)."""
    from xformer_cli.device import cpu_flags, resolve_decode_precision

    if engine not in ENGINES:
        raise XformerError(f"--engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    if engine != "ctranslate2" and precision not in DECODE_PRECISIONS:  # CTranslate2 checks its own names
        raise XformerError(f"--precision must be one of {', '.join(DECODE_PRECISIONS)}, not {precision!r}")
    if engine == "xformer" and precision not in ("auto", *TORCH_DECODE_PRECISIONS):
        raise XformerError(f"--engine xformer computes in {', '.join(TORCH_DECODE_PRECISIONS)} (or auto), not "
                           f"{precision}, which is CTranslate2's: --engine ctranslate2 (or auto) for it")
    if not paths:
        raise XformerError("no model given")
    exported = len(paths) == 1 and paths[0].is_dir()
    if exported or engine == "ctranslate2" or precision not in ("auto", *TORCH_DECODE_PRECISIONS):
        return _ctranslate2_choice(paths, engine, precision, device, exported, needs)
    if engine == "xformer" or precision != "auto" or _torch_sees_cuda(device):
        torch_device = engine_device("xformer", device)
        chosen, why = resolve_decode_precision(precision, _device(torch_device), flags)
        return EngineChoice("xformer", chosen, torch_device, why)
    blockers = [need for need in XFORMER_ONLY if need in set(needs) or (need == "ensemble" and len(paths) > 1)]
    chosen_engine, chosen, why = auto_choice(cpu_flags() if flags is None else flags, ctranslate2_installed(), blockers)
    return EngineChoice(chosen_engine, chosen, engine_device(chosen_engine, device), why)


def searches_beam(beam_size: Optional[int], paths: Sequence[Path]) -> bool:
    """Whether a run of ``beam_size`` (None: the first model's ``decode.beam_size``) searches a
    beam, the ``beam_search`` need: a checkpoint saved for greedy search leaves the fastest greedy
    engine free to run it. An export directory runs on CTranslate2 whichever it is; a missing
    file is named by the engine's loading."""
    if beam_size is not None:
        return beam_size != 1
    if not paths or not Path(paths[0]).is_file():
        return True
    from xformer_cli.checkpoint_file import read_light
    from xformer_cli.config import DecodeConfig

    config = read_light(paths[0]).get("config")
    decode = config.get("decode") if isinstance(config, dict) else None
    saved = decode.get("beam_size") if isinstance(decode, dict) else None
    return (saved if isinstance(saved, int) else DecodeConfig.beam_size) != 1


def _ctranslate2_choice(paths: Sequence[Path], engine: str, precision: str, device: str,
                        exported: bool, needs: Iterable[str] = ()) -> EngineChoice:
    from xformer_cli.decode.ct2_engine import CTranslate2Translator
    from xformer_cli.decode.engine import option_name

    if exported and engine != "ctranslate2" and (engine == "xformer" or not is_export_directory(paths[0])):
        raise XformerError(f"{paths[0]} is a directory: give a checkpoint file, or a directory written by "
                           "xformer export (with --engine ctranslate2)")
    if len(paths) != 1:
        raise XformerError("the ctranslate2 engine takes one model, not an ensemble")
    refused = [option_name(need) for need in needs if need in CTranslate2Translator.unsupported]
    if refused:  # said before a checkpoint is exported for it
        runs_it = f"{paths[0]} is an export, which runs on CTranslate2," if exported else "the ctranslate2 engine"
        raise XformerError(f"{runs_it} does not support {', '.join(refused)}")
    compute_type = "default" if precision == "auto" else CT2_COMPUTE_TYPES.get(precision, precision)
    why = "the export's own weights" if exported else "float32 weights"
    if precision != "auto":
        why = "asked for"
    return EngineChoice("ctranslate2", compute_type, engine_device("ctranslate2", device), why)


def _torch_sees_cuda(device: str) -> bool:
    import torch

    return device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())


def _device(name: str):
    import torch

    return torch.device(name)


# -- building ------------------------------------------------------------------------------------

def load_engine(models: "str | Path | Sequence[str | Path]", engine: str = "auto", precision: str = "auto",
                device: str = "auto", threads: int = 0, needs: Optional[Iterable[str]] = None,
                serving: bool = False, log: Optional[Log] = None) -> Engine:
    """An engine on ``models`` (a checkpoint, several for an ensemble, or an export directory).

    ``needs``: what the request will use that only the xformer engine has (``XFORMER_ONLY``),
    so that precision auto does not pick an engine that must then refuse it; None: what
    ``xformer translate`` with the model's own options needs (beam search where its
    ``decode.beam_size`` searches a beam), so the API picks the engine the CLI picks. ``threads``: 0 =
    ``decode_threads``'s rule (``serving``: a core left to HTTP); PyTorch's count is set for the
    whole process; the engine's ``threads`` says it. ``log`` gets the line that says what was
    chosen and why."""
    paths = [Path(models)] if isinstance(models, (str, Path)) else [Path(m) for m in models]
    if needs is None:
        needs = ("beam_search",) if searches_beam(None, paths) else ()
    choice = choose_engine(paths, engine, precision, device, needs)  # bad options first, then files
    for path in paths:
        if not path.exists():  # said here: precision auto may send a checkpoint down either path
            raise XformerError(f"{'model' if engine == 'ctranslate2' else 'checkpoint'} not found: {path}")
    count = decode_threads(threads, choice.engine, serving)
    if log is not None:
        log(f"{choice.describe(precision)}, {count} thread{'s' if count > 1 else ''}")
    if choice.engine == "xformer":
        import torch

        from xformer_cli.decode.translator import Translator

        torch.set_num_threads(count)
        built: Engine = Translator.from_checkpoint(paths, device=choice.device, precision=choice.precision)
    else:
        built = _ctranslate2_engine(paths[0], choice, count, log, device)
    built.threads = count
    return built


def _ctranslate2_engine(path: Path, choice: EngineChoice, threads: int, log: Optional[Log],
                        asked: str = "auto") -> Engine:
    """The CTranslate2 engine on an export, or on ``path`` exported at start to a temporary
    directory (int8 weights when int8 computes), removed once the engine has read it. Not
    cached: exporting costs a fraction of loading (docs/benchmarks/decoding.md, "Choosing the engine").
    A GPU that ``asked`` = auto chose but CTranslate2 cannot compute on gives the CPU, said in the log."""
    from xformer_cli.decode.ct2_engine import CudaUnusable

    try:
        return _ctranslate2_engine_on(path, choice, threads, log)
    except CudaUnusable as exc:
        if asked != "auto":
            raise
        on_cpu = replace(choice, device="cpu", precision=CPU_COMPUTE_TYPE.get(choice.precision, choice.precision))
        if log is not None:
            log(f"CTranslate2 cannot run on CUDA here ({exc.reason}): on the CPU instead, {on_cpu.precision}")
        return _ctranslate2_engine_on(path, on_cpu, threads, log)


# A GPU compute type's nearest on a CPU, which CTranslate2 computes in neither half precision
CPU_COMPUTE_TYPE = {"float16": "float32", "bfloat16": "float32", "int8_float16": "int8_float32",
                    "int8_bfloat16": "int8_float32"}


def _ctranslate2_engine_on(path: Path, choice: EngineChoice, threads: int, log: Optional[Log]) -> Engine:
    import tempfile

    from xformer_cli.decode.ct2_engine import CTranslate2Translator
    from xformer_cli.export.common import load_for_export
    from xformer_cli.export.ctranslate2 import export_ctranslate2
    from xformer_cli.export.shortlist import VMAP_FILE

    _default_waits_for_ctranslate2()
    kind, _, index = choice.device.partition(":")
    load = lambda directory: CTranslate2Translator.from_directory(  # noqa: E731
        directory, device=kind, device_index=int(index or 0), compute_type=choice.precision, threads=threads)
    if path.is_dir():
        built = load(path)
        if getattr(built, "shortlist", False) and log is not None:
            log(f"shortlist: each step scores only the candidates of the batch's source pieces ({path}/{VMAP_FILE})")
        return built
    if log is not None:
        log(f"exporting {path} for CTranslate2 (a temporary directory, removed once loaded)")
    loaded = load_for_export(path, "CTranslate2")  # read once: the export and the engine's config
    with tempfile.TemporaryDirectory(prefix="xformer-ct2-") as tmp:
        quantization = "int8" if choice.precision.startswith("int8") else None
        built = load(export_ctranslate2(path, Path(tmp) / "ct2", quantization=quantization, loaded=loaded))
    built.config = loaded[2]
    return built


def engine_for_model(model: Transformer, tokenizer: Tokenizer, decode: DecodeConfig, device: torch.device,
                     precision: str = "auto", languages: Optional[Languages] = None) -> Engine:
    """The xformer engine on an in-memory model (the trainer's validation), in the precision
    ``load_engine`` would give it on ``device``: ``auto`` follows the same PyTorch rule
    (``device.resolve_decode_precision``: on CUDA by compute capability, on a CPU bf16 where it
    computes bf16 natively). The model's own weights stay as they are, but it is put in eval
    mode (``Translator``): a caller that trains on calls ``model.train()`` after. ``languages``
    (``config.data.languages()``): a multilingual model's directions, so that
    ``translate(lines, target_lang=...)`` leads the lines with the target's tag."""
    from xformer_cli.decode.translator import Translator
    from xformer_cli.device import resolve_decode_precision

    chosen = resolve_decode_precision(precision, device)[0]
    if chosen not in TORCH_DECODE_PRECISIONS:
        raise XformerError("validation decodes with the xformer engine: precision "
                           f"{', '.join(TORCH_DECODE_PRECISIONS)}, not {precision!r}")
    return Translator(model, tokenizer, decode, device, precision=chosen, languages=languages)
