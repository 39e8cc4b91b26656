"""Making data, not only models: back-translation, distillation and a small fast student as
one resumable pipeline (``xformer pipeline``; docs/pipeline.md).

``settings.py`` reads the pipeline config, ``record.py`` keeps each stage's fingerprint,
``corpus_translation.py`` translates a corpus in resumable chunks, ``models.py`` derives each
trained model's config, ``stages.py`` holds the stages, ``evaluation.py`` the table,
``runner.py`` runs them in order (``checks.py`` finds what would stop a stage before the
first starts; ``earlier_forms.py`` takes over an earlier version's records), and ``status.py``
says what a run would do with each (``--status``). Each stage is importable::

    from xformer_cli.pipeline import Pipeline, load_pipeline_config, run_stage
    pipe = Pipeline(load_pipeline_config("configs/pipeline-smoke.yaml"))
    run_stage(pipe, "reverse")
"""

from xformer_cli.pipeline.runner import pipeline_status, run_pipeline, run_stage
from xformer_cli.pipeline.settings import PipelineConfig, load_pipeline_config
from xformer_cli.pipeline.stages import STAGES, Pipeline

__all__ = ["Pipeline", "PipelineConfig", "STAGES", "load_pipeline_config", "pipeline_status", "run_pipeline",
           "run_stage"]
