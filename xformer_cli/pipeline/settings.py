"""A pipeline config (configs/*-pipeline.yaml): which training config every model starts
from, the monolingual text, and each stage's settings. Read as train's configs are: YAML,
``${ENV:-default}``, ``--set key=value`` overrides (``--set run_dir=...`` too), every
unknown or mistyped key named in one line."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from xformer_cli.cpu_cores import too_many_threads
from xformer_cli.errors import XformerError
from xformer_cli.config import MAX_BEAM_SIZE
from xformer_cli.precisions import DECODE_PRECISIONS, ENGINES, EXPORT_QUANTIZATIONS, TORCH_DECODE_PRECISIONS
from xformer_cli.settings_file import apply_overrides, build_section, read_tree, require


@dataclass
class MonoConfig:
    target: str = ""  # target-language text for back-translation (mono.de for en->de)
    source: str = ""  # source-language text the teacher translates for the student (mono.en)
    max_lines: int = 0  # the first N usable lines of each; 0 = all
    skip_invalid_utf8: bool = False  # true: drop undecodable lines (counted) instead of stopping


@dataclass
class ModelStage:
    """A stage that trains: its overrides of the model config (dotted keys)."""

    set: dict[str, Any] = field(default_factory=dict)


@dataclass
class ReverseStage(ModelStage):
    checkpoint: Optional[str] = None  # an existing tgt->src model to use instead of training one


@dataclass
class TranslateStage:
    """A stage that translates a corpus."""

    beam_size: int = 4
    sampling_topk: int = 0  # > 0 (with beam_size 1): sampled translations (Edunov et al., 2018)
    temperature: float = 1.0
    chunk_lines: int = 2000  # lines per engine call, and the unit a killed run resumes by
    engine: str = "auto"  # auto | xformer | ctranslate2 (decode.factory's rules)
    precision: str = "auto"
    # the engine's batches within a chunk, either engine (0: the model's decode.batch_size /
    # decode.max_tokens): a GPU wants far more sentences a batch than a CPU
    batch_size: int = 0
    max_tokens: int = 0


@dataclass
class BacktranslateStage(TranslateStage):
    # Also back-translate the real pairs' target side, for the teacher to train on those new sources
    # beside the originals (tagged, at weight 1, until teacher.synthetic_until): paraphrases of the
    # sources in the test's own domain, which the monolingual captions are not (data diversification,
    # Nguyen et al. 2020, with the reverse model's half of it)
    real_targets: bool = False


@dataclass
class TeacherStage(ModelStage):
    tag: str = "<bt>"  # leads every back-translated source (a control piece: user text cannot hold it)
    synthetic_weight: float = 1.0  # the synthetic corpus's data.train weight (1 = every pair once an epoch)
    # The share of the teacher's planned steps the synthetic corpus trains in (its data.train until):
    # below 1, the run ends on the real pairs alone, as fine-tuning on them after back-translation does
    synthetic_until: float = 1.0
    # One teacher per seed (its train.seed, over any other), trained one after another: the first in
    # <run_dir>/teacher, each other in <run_dir>/teacher/seed-<seed> on the first's tokenizer;
    # distill's "teacher" is all of them, an ensemble. Empty: one teacher at the train.seed the
    # model config (with model_set and teacher.set) gives.
    seeds: list[int] = field(default_factory=list)


@dataclass
class DistillStage(TranslateStage):
    # Checkpoints whose mean translates (an ensemble); "teacher" is the teacher stage's best.pt, of
    # every seed (teacher.seeds).
    teachers: list[str] = field(default_factory=lambda: ["teacher"])
    mono_source: bool = True  # translate mono.source too, not only the training sources


@dataclass
class StudentStage(ModelStage):
    real_pairs: bool = False  # train on the real pairs beside the distilled ones


@dataclass
class ExportStage:
    quantization: str = "int8"  # CTranslate2's: int8, int8_float32, int16, float16, ...
    shortlist: bool = False  # a lexical shortlist from the student's training pairs (export/shortlist.py)
    shortlist_per_source: int = 20  # target candidates per source piece
    shortlist_frequent: int = 100  # the most frequent target pieces, candidates in every batch


@dataclass
class EvaluateStage:
    splits: list[str] = field(default_factory=lambda: ["valid", "test"])
    beam_sizes: list[int] = field(default_factory=lambda: [1, 4])  # each model at each beam size
    threads: int = 0  # the same for every model; 0 = the engines' rule (decode.factory)
    max_lines: int = 0  # the first N lines of each split; 0 = all
    timed_passes: int = 2  # each row's speed is its fastest pass, the rows' passes taken in turns: a burst of
                           # another process slows one pass, not one model
    baseline: Optional[str] = None  # a checkpoint to score beside the pipeline's models (the main job's best.pt)


@dataclass
class PipelineConfig:
    run_dir: str = "runs/pipeline"
    model_config: str = ""  # the training config every model starts from, relative to this file
    model_set: dict[str, Any] = field(default_factory=dict)  # overrides for every trained model
    threads: int = 0  # CPU threads for training and translating (train.threads); 0 = all
    # The whole path's minutes at most (0: no bound): the student trains no longer than the finished
    # stages before it leave, less reserve_minutes (its passes after training, export, evaluate).
    budget_minutes: float = 0.0
    reserve_minutes: float = 10.0
    mono: MonoConfig = field(default_factory=MonoConfig)
    reverse: ReverseStage = field(default_factory=ReverseStage)
    backtranslate: BacktranslateStage = field(default_factory=BacktranslateStage)
    teacher: TeacherStage = field(default_factory=TeacherStage)
    distill: DistillStage = field(default_factory=DistillStage)
    student: StudentStage = field(default_factory=lambda: StudentStage(
        set={"model.encoder_layers": 6, "model.decoder_layers": 1, "model.pre_norm": True}))
    export: ExportStage = field(default_factory=ExportStage)
    evaluate: EvaluateStage = field(default_factory=EvaluateStage)
    base_dir: Path = Path(".")  # the pipeline file's folder (model_config is relative to it)

    @property
    def model_config_path(self) -> Path:
        path = Path(self.model_config)
        return path if path.is_absolute() else self.base_dir / path


def load_pipeline_config(path: str | Path, overrides: Optional[list[str]] = None) -> PipelineConfig:
    """Read a pipeline YAML file, apply ``key=value`` overrides, check it."""
    tree = read_tree(path)
    apply_overrides(tree, overrides or [])
    if "base_dir" in tree:
        raise XformerError("unknown config key 'base_dir'")
    config = build_section(PipelineConfig, tree)
    config.base_dir = Path(path).parent
    check(config)
    return config


def check(config: PipelineConfig) -> None:
    """Each key's range, named in one line; files are checked by the stage that reads them."""
    require(bool(config.run_dir.strip()), "run_dir", "must not be empty")
    require(not Path(config.run_dir).exists() or Path(config.run_dir).is_dir(), "run_dir",
            f"{config.run_dir} is a file, not a folder")  # --status would otherwise plan stages that cannot start
    require(bool(config.model_config), "model_config", "the training config every model starts from (configs/...)")
    require(config.mono.max_lines >= 0, "mono.max_lines", "must be 0 (all) or more")
    require(config.budget_minutes >= 0 and config.reserve_minutes >= 0, "budget_minutes",
            "budget_minutes and reserve_minutes must be 0 or more (budget_minutes 0: no bound)")
    for name in ("backtranslate", "distill"):
        stage: TranslateStage = getattr(config, name)
        require(stage.chunk_lines >= 1, f"{name}.chunk_lines", "must be 1 or more")
        require(1 <= stage.beam_size <= MAX_BEAM_SIZE, f"{name}.beam_size", f"must be 1 to {MAX_BEAM_SIZE}")
        require(stage.engine in ENGINES, f"{name}.engine", f"must be one of {', '.join(ENGINES)}")
        require(stage.precision in DECODE_PRECISIONS, f"{name}.precision",
                f"must be one of {', '.join(DECODE_PRECISIONS)}")
        require(stage.engine != "xformer" or stage.precision in ("auto", *TORCH_DECODE_PRECISIONS), f"{name}.precision",
                f"the xformer engine computes in {', '.join(TORCH_DECODE_PRECISIONS)} (or auto)")
        require(not stage.sampling_topk or stage.beam_size == 1, f"{name}.sampling_topk",
                "sampling draws one translation per sentence: set beam_size to 1")
        require(stage.temperature > 0, f"{name}.temperature", "must be positive")
        for key in ("batch_size", "max_tokens"):
            require(getattr(stage, key) >= 0, f"{name}.{key}", "must be 0 (the model's decode setting) or more")
    require(config.teacher.synthetic_weight > 0, "teacher.synthetic_weight", "must be positive")
    require(0 < config.teacher.synthetic_until <= 1, "teacher.synthetic_until",
            "must be above 0 and at most 1 (a share of the teacher's planned steps)")
    seeds = config.teacher.seeds
    require(all(seed >= 0 for seed in seeds) and len(set(seeds)) == len(seeds), "teacher.seeds",
            "distinct whole numbers, 0 or more (one teacher per seed)")
    require(len(seeds) < 2 or "teacher" in config.distill.teachers, "teacher.seeds",
            "several teachers are trained for distill.teachers to use: name 'teacher' there")
    require(bool(config.distill.teachers), "distill.teachers", "name at least one teacher checkpoint")
    require(all(1 <= b <= MAX_BEAM_SIZE for b in config.evaluate.beam_sizes) and bool(config.evaluate.beam_sizes),
            "evaluate.beam_sizes", f"one or more beam sizes, each 1 to {MAX_BEAM_SIZE}")
    require(set(config.evaluate.splits) <= {"valid", "test"} and bool(config.evaluate.splits),
            "evaluate.splits", "valid, test or both")
    require(config.evaluate.max_lines >= 0, "evaluate.max_lines", "must be 0 (all) or more")
    require(config.evaluate.timed_passes >= 1, "evaluate.timed_passes", "must be 1 or more")
    require(config.export.quantization in EXPORT_QUANTIZATIONS, "export.quantization",
            f"one of {', '.join(EXPORT_QUANTIZATIONS)}")
    for key, threads in (("threads", config.threads), ("evaluate.threads", config.evaluate.threads)):
        require(threads >= 0, key, "must be 0 (every core) or more")
        threads_refused = too_many_threads(threads, "it")
        require(not threads_refused, key, threads_refused)
    require(config.export.shortlist_per_source >= 1, "export.shortlist_per_source", "must be 1 or more")
    require(config.export.shortlist_frequent >= 0, "export.shortlist_frequent", "must be 0 or more")
