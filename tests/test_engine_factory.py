"""decode.factory: the one place engines are built. Its rules (engine and precision for
--precision auto, device, threads) run here on faked CPU flags, GPUs and cores."""

import json
import subprocess
import sys
import types

import pytest
import torch

from xformer_cli import device as device_module
from xformer_cli.decode import factory
from xformer_cli.decode.factory import auto_choice, choose_engine, decode_threads, engine_for_model, load_engine
from xformer_cli.decode.translator import Translator
from xformer_cli.errors import XformerError
from xformer_cli.export.format import EXPORT_INFO

from helpers import ROOT

SAPPHIRE_RAPIDS = {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_int8", "avx512_vnni", "amx_tile"}
ZEN4 = {"avx2", "avx512f", "avx512_bf16", "avx512_vnni"}  # the AMD EPYC BENCHMARKS.md measured on
ZEN3 = {"avx2", "fma", "sse4_2"}


@pytest.mark.parametrize("flags, installed, blockers, expected", [
    (SAPPHIRE_RAPIDS, True, (), ("ctranslate2", "float32")),  # AMX: CTranslate2's parallel batches beat bf16
    (SAPPHIRE_RAPIDS, True, ("beam_search",), ("xformer", "bf16")),  # xformer's beam search asked for
    (SAPPHIRE_RAPIDS, False, (), ("xformer", "bf16")),
    (ZEN4, True, (), ("xformer", "bf16")),  # CTranslate2's beam search lost more than 0.2 BLEU
    (ZEN3, True, (), ("ctranslate2", "float32")),  # greedy on a CPU without bf16: fp32's output, faster
    (ZEN3, True, ("beam_search",), ("xformer", "fp32")),
    (ZEN4, False, (), ("xformer", "bf16")),  # CTranslate2 not installed: PyTorch's own rule
    (ZEN3, False, (), ("xformer", "fp32")),
    (ZEN3, True, ("ensemble",), ("xformer", "fp32")),  # what CTranslate2 cannot do keeps PyTorch
])
def test_precision_auto_follows_the_cpu_flags_and_what_is_installed(flags, installed, blockers, expected):
    engine, precision, why = auto_choice(flags, installed, blockers)
    assert (engine, precision) == expected
    assert why and ("ensemble" in why) == ("ensemble" in blockers)


def test_the_log_line_names_what_kept_pytorch_in_words():
    assert set(factory.XFORMER_ONLY_WORDS) == set(factory.XFORMER_ONLY)
    why = auto_choice(ZEN3, True, ("beam_search", "ensemble"))[2]
    assert why.endswith("only xformer has: xformer's beam search (CTranslate2's ranks and stops otherwise), "
                        "an ensemble"), why


def _fake_export(directory):
    directory.mkdir()
    (directory / EXPORT_INFO).write_text(json.dumps({"format": "xformer-ctranslate2"}), encoding="utf-8")
    return directory


@pytest.fixture
def loaded_ct2(monkeypatch):
    """CTranslate2Translator.from_directory replaced by a recorder of its arguments."""
    from xformer_cli.decode import ct2_engine

    calls = []

    def record(cls, path, **kwargs):
        calls.append(kwargs)
        return types.SimpleNamespace(name="ctranslate2")

    monkeypatch.setattr(ct2_engine.CTranslate2Translator, "from_directory", classmethod(record))
    return calls


def test_engine_ctranslate2_runs_on_cuda_when_ctranslate2_sees_a_gpu(tmp_path, monkeypatch, loaded_ct2):
    export = _fake_export(tmp_path / "ct2")
    monkeypatch.setattr(factory, "ctranslate2_gpus", lambda: 1)
    assert load_engine(export, "ctranslate2", device="auto", threads=1).threads == 1
    assert loaded_ct2[-1] == dict(device="cuda", device_index=0, compute_type="default", threads=1)
    load_engine(export, "ctranslate2", precision="int8", device="cuda:0", threads=3)
    assert loaded_ct2[-1] == dict(device="cuda", device_index=0, compute_type="int8", threads=3)
    with pytest.raises(XformerError, match="CTranslate2 sees 1 GPU"):
        load_engine(export, "ctranslate2", device="cuda:1")
    monkeypatch.setattr(factory, "ctranslate2_gpus", lambda: 0)
    load_engine(export, device="auto", threads=2)  # engine auto: an export directory is CTranslate2's
    assert loaded_ct2[-1]["device"] == "cpu"


def test_choices_for_checkpoints_and_directories(tmp_path, monkeypatch):
    checkpoint = tmp_path / "best.pt"
    checkpoint.write_bytes(b"")
    monkeypatch.setattr(factory, "ctranslate2_installed", lambda: True)
    monkeypatch.setattr(factory, "ctranslate2_gpus", lambda: 0)

    def choose(*args, paths=(checkpoint,), **kw):
        chosen = choose_engine(list(paths), *args, device="cpu", **kw)
        return chosen.engine, chosen.precision, chosen.device

    assert choose(flags=ZEN3) == ("ctranslate2", "float32", "cpu")
    assert choose(flags=ZEN3, needs=["beam_search"])[:2] == ("xformer", "fp32")
    assert choose(flags=ZEN4) == ("xformer", "bf16", "cpu")
    assert choose(flags=SAPPHIRE_RAPIDS) == ("ctranslate2", "float32", "cpu")
    assert choose(flags=SAPPHIRE_RAPIDS, needs=["beam_search"])[:2] == ("xformer", "bf16")
    assert choose(paths=[checkpoint, checkpoint], flags=SAPPHIRE_RAPIDS)[:2] == ("xformer", "bf16")
    assert choose(needs=["attention"], flags=ZEN4)[:2] == ("xformer", "bf16")
    assert choose("xformer", flags=ZEN4)[:2] == ("xformer", "bf16")  # an engine asked for is kept
    assert choose("auto", "fp32")[:2] == ("xformer", "fp32")
    assert choose("auto", "int8")[:2] == ("ctranslate2", "int8")  # int8 is CTranslate2's
    for ct2_only in ("int8", "float16", "int16"):  # an engine asked for runs, or the command says why not
        with pytest.raises(XformerError, match=rf"^--engine xformer computes in fp32, bf16, fp16 \(or auto\), not {ct2_only}"):
            choose("xformer", ct2_only)
    assert choose("ctranslate2", "fp32")[:2] == ("ctranslate2", "float32")
    assert choose(paths=[checkpoint, checkpoint], flags=ZEN3)[:2] == ("xformer", "fp32")  # an ensemble
    with pytest.raises(XformerError, match="--precision must be one of"):
        choose("auto", "fp64")
    with pytest.raises(XformerError, match="--engine must be one of"):
        choose("onnx")
    with pytest.raises(XformerError, match="--engine ctranslate2"):  # a directory that is no export
        choose_engine([tmp_path], device="cpu")
    with pytest.raises(XformerError, match="not an ensemble"):
        choose_engine([checkpoint, checkpoint], "ctranslate2", device="cpu")
    # what CTranslate2 cannot do, refused before a checkpoint is exported for it, by the option's own name
    with pytest.raises(XformerError, match=r"^the ctranslate2 engine does not support --no-cache$"):
        choose("ctranslate2", needs=["use_cache", "beam_search"])
    with pytest.raises(XformerError, match=r"an export, which runs on CTranslate2, does not support --sampling-topk, --seed"):
        export = tmp_path / "ct2"
        export.mkdir()
        (export / EXPORT_INFO).write_text("{}")
        monkeypatch.setattr(factory, "is_export_directory", lambda path: True)
        choose(paths=[export], needs=["sampling_topk", "seed"])
    assert choose("ctranslate2", needs=["beam_search"])[0] == "ctranslate2"  # it has a beam search of its own


def test_the_log_line_says_what_auto_chose_and_why(tmp_path, monkeypatch, loaded_ct2):
    export = _fake_export(tmp_path / "ct2")
    monkeypatch.setattr(factory, "ctranslate2_gpus", lambda: 0)
    lines = []
    load_engine(export, threads=1, log=lines.append)
    assert lines == ["precision: auto -> ctranslate2 default on cpu (the export's own weights), 1 thread"]


def test_threads_rule(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setattr(factory, "_passive_set_here", False)
    monkeypatch.setattr(factory, "available_cores", lambda: 2)
    assert decode_threads() == 1  # spinning torch threads: one core left, so a busy machine does not collapse
    assert decode_threads(engine="ctranslate2") == 2  # its OpenMP's default waits: every core
    assert decode_threads(2) == 2  # asked for
    with pytest.raises(XformerError, match=r"^--threads must be >= 0 \(0 = every core\), not -3$"):
        decode_threads(-3)
    monkeypatch.setenv("OMP_WAIT_POLICY", "passive")
    assert decode_threads() == 2  # sleeping torch threads: every core
    assert decode_threads(serving=True) == 1  # serve leaves one core to HTTP
    monkeypatch.setattr(factory, "available_cores", lambda: 16)
    assert decode_threads() == 16 and decode_threads(serving=True) == 15
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert decode_threads() == 4


def test_thread_counts_past_eight_a_core_are_refused(monkeypatch):
    """Thousands of OpenMP threads hang or crash the process (a segfault at 100000): one line
    instead, for translate's --threads, $OMP_NUM_THREADS, train.threads and the pipeline's."""
    from xformer_cli import cpu_cores
    from xformer_cli.config import load_config
    from xformer_cli.pipeline import load_pipeline_config

    monkeypatch.setattr(cpu_cores, "available_cores", lambda: 2)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert decode_threads(16) == 16
    with pytest.raises(XformerError, match=r"^--threads is 17: at most 16 \(8 a core; this process may use 2\)$"):
        decode_threads(17)
    monkeypatch.setenv("OMP_NUM_THREADS", "99999")
    with pytest.raises(XformerError, match=r"^\$OMP_NUM_THREADS is 99999: at most 16"):
        decode_threads()
    with pytest.raises(XformerError, match=r"^config key 'train.threads': it is 100000: at most 16"):
        load_config(ROOT / "configs" / "multi30k.yaml", ["train.threads=100000"])
    with pytest.raises(XformerError, match=r"^config key 'threads': it is 17: at most 16"):
        load_pipeline_config(ROOT / "configs" / "pipeline-smoke.yaml", ["threads=17"])


def test_loading_ctranslate2_leaves_torch_its_thread_count():
    """CTranslate2's OpenMP is PyTorch's: its load sets the count PyTorch then runs on; the
    engine's load puts PyTorch's back (test_export.py checks it on a real export)."""
    import torch

    from xformer_cli.decode.ct2_engine import keeping_torch_threads

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        with keeping_torch_threads():
            torch.set_num_threads(2)  # what CTranslate2's load does to the shared OpenMP
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.slow
def test_the_cli_makes_torch_threads_sleep_and_leaves_ctranslate2_its_default():
    code = ("import os, sys; os.environ.pop('OMP_WAIT_POLICY', None); from xformer_cli.cli.common import before_torch; "
            "before_torch(); print(os.environ['OMP_WAIT_POLICY'], 'torch' in sys.modules); "
            "from xformer_cli.decode import factory; factory._default_waits_for_ctranslate2(); "
            "print(os.environ.get('OMP_WAIT_POLICY', 'unset'), factory.torch_waits_passive())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["PASSIVE", "False", "unset", "True"]


def test_a_translator_is_always_a_translator(tmp_path):
    with pytest.raises(XformerError, match="load_engine"):
        Translator.from_checkpoint(tmp_path / "best.pt", device="cpu", precision="int8")


@pytest.mark.parametrize("flags, expected", [(ZEN3, "fp32"), (ZEN4, "bf16")])
def test_validation_engine_on_an_in_memory_model(monkeypatch, flags, expected):
    """engine_for_model decodes the trainer's model as `translate --engine xformer` would on
    this machine (faked here), and never changes the weights the trainer goes on training."""
    from xformer_cli.config import DecodeConfig
    from xformer_cli.model.transformer import ModelConfig, Transformer

    monkeypatch.setattr(device_module, "proc_cpu_flags", lambda: frozenset(flags))
    monkeypatch.delenv(device_module.CPU_FLAGS_MASK_ENV, raising=False)
    model = Transformer(ModelConfig(d_model=32, d_ff=64, n_heads=4, encoder_layers=1, decoder_layers=1), src_vocab=50)
    cpu = torch.device("cpu")
    engine = engine_for_model(model, None, DecodeConfig(), cpu)
    assert isinstance(engine, Translator) and engine.precision == expected
    assert next(engine.model.parameters()).dtype == {"fp32": torch.float32, "bf16": torch.bfloat16}[expected]
    assert (engine.model is model) == (expected == "fp32")  # bf16: a copy; the trainer's fp32 weights stay
    assert next(model.parameters()).dtype == torch.float32
    asked = engine_for_model(model, None, DecodeConfig(), cpu, precision="fp32")
    assert asked.precision == "fp32" and asked.model is model
    with pytest.raises(XformerError, match="fp32, bf16, fp16, not 'int8'"):
        engine_for_model(model, None, DecodeConfig(), cpu, precision="int8")


@pytest.mark.parametrize("name, capability, expected", [
    ("Tesla T4", (7, 5), "fp16"), ("NVIDIA A100-SXM4-40GB", (8, 0), "bf16"), ("Tesla P100-PCIE-16GB", (6, 0), "fp32"),
])
def test_precision_auto_on_a_gpu_follows_its_compute_capability(tmp_path, monkeypatch, name, capability, expected):
    checkpoint = tmp_path / "best.pt"
    checkpoint.write_bytes(b"")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(device_module, "configure_cuda", lambda: None)  # process-wide flags: left alone here
    monkeypatch.setattr(factory, "ctranslate2_installed", lambda: True)
    chosen = choose_engine([checkpoint], flags=ZEN3)  # the CPU's flags play no part once torch sees a GPU
    assert (chosen.engine, chosen.precision, chosen.device) == ("xformer", expected, "cuda")
    assert name in chosen.describe() and chosen.describe().startswith(f"precision: auto -> xformer {expected} on cuda")


@pytest.mark.slow
def test_a_gpu_ctranslate2_cannot_compute_on_gives_the_cpu_for_auto_and_one_line_for_cuda(multi30k, tmp_path,
                                                                                        monkeypatch):
    """CTranslate2 4.x loads CUDA 12's cuBLAS at its first product, not at load: on a CUDA 13 machine it
    counts the GPU, loads the model, and fails at the first translate_batch."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    from helpers import tiny_checkpoint

    from xformer_cli.export.ctranslate2 import export_ctranslate2
    from xformer_cli.pipeline.evaluation import _engine_label

    export = export_ctranslate2(tiny_checkpoint(multi30k, tmp_path / "last.pt", steps=0), tmp_path / "ct2")
    real = ctranslate2.Translator

    failure = ["Library libcublas.so.12 is not found or cannot be loaded"]

    class NoCublas:  # what a CUDA 13 machine's CTranslate2 does on device="cuda"
        def __init__(self, path, device="cpu", compute_type="default", **kwargs):
            self.translator = real(path, device="cpu", **kwargs)

        def translate_batch(self, *args, **kwargs):
            raise RuntimeError(failure[0])

    monkeypatch.setattr(ctranslate2, "Translator", lambda path, device="cpu", **kwargs:
                        NoCublas(path, **kwargs) if device == "cuda" else real(path, device=device, **kwargs))
    monkeypatch.setattr(factory, "ctranslate2_gpus", lambda: 1)
    said = []
    engine = load_engine(export, "ctranslate2", device="auto", threads=1, log=said.append)
    assert len(engine.translate(["A man rides a bike."], beam_size=1)) == 1  # it translates, on the CPU
    assert engine.device == "cpu" and _engine_label(said, engine) == "ctranslate2 float32 on cpu"  # evaluate's column
    assert said[0].startswith("precision: auto -> ctranslate2 default on cuda")
    assert said[1] == ("CTranslate2 cannot run on CUDA here (Library libcublas.so.12 is not found or cannot be "
                       "loaded): on the CPU instead, default")
    with pytest.raises(XformerError, match=r"cannot run on CUDA here \(Library libcublas.so.12 .*--device cpu"):
        load_engine(export, "ctranslate2", device="cuda", threads=1)
    said.clear()  # a GPU compute type becomes its CPU kind (CTranslate2 computes no float16 on a CPU)
    engine = load_engine(export, "ctranslate2", precision="float16", device="auto", threads=1, log=said.append)
    assert said[1].endswith("on the CPU instead, float32") and engine.precision == "float32"
    failure[0] = "CUDA failed with error out of memory"  # not a missing library: no CPU for it, one line
    with pytest.raises(XformerError, match=r"cannot run on CUDA \(CUDA failed with error out of memory\)"):
        load_engine(export, "ctranslate2", device="auto", threads=1)


def test_a_checkpoint_saved_for_greedy_search_does_not_ask_for_xformers_beam_search(tmp_path):
    """Without --beam-size the model's decode.beam_size decides whether beam search is a need
    (which keeps auto on xformer's engine where CTranslate2 would run greedy search faster)."""
    import torch

    from xformer_cli.decode.factory import searches_beam

    greedy, beam, old = tmp_path / "greedy.pt", tmp_path / "beam.pt", tmp_path / "old.pt"
    torch.save({"config": {"decode": {"beam_size": 1}}}, greedy)
    torch.save({"config": {"decode": {"beam_size": 5}}}, beam)
    torch.save({"config": {}}, old)  # no decode section: the default, a beam
    assert [searches_beam(None, [path]) for path in (greedy, beam, old)] == [False, True, True]
    assert searches_beam(4, [greedy]) and not searches_beam(1, [beam])  # --beam-size wins
    assert searches_beam(None, [greedy, beam]) is False  # an ensemble decodes with its first model's settings
    assert searches_beam(None, [tmp_path]) is True  # an export: CTranslate2 runs it either way


def test_the_python_apis_load_engine_asks_for_what_the_cli_asks_by_default(tmp_path, monkeypatch):
    """load_engine(path) asked for nothing: on a CPU where auto gives greedy search to
    CTranslate2, a beam-4 checkpoint went to CTranslate2's beam search from Python and to
    xformer's from the CLI (docs: "the engine xformer translate would pick")."""
    import torch

    from xformer_cli.decode import factory

    asked = []

    def choose(paths, engine, precision, device, needs):
        asked.append(tuple(needs))
        raise XformerError("stop here")

    monkeypatch.setattr(factory, "choose_engine", choose)
    greedy, beam = tmp_path / "greedy.pt", tmp_path / "beam.pt"
    torch.save({"config": {"decode": {"beam_size": 1}}}, greedy)
    torch.save({"config": {"decode": {"beam_size": 4}}}, beam)
    for path in (beam, greedy):
        with pytest.raises(XformerError, match="stop here"):
            factory.load_engine(path)
    with pytest.raises(XformerError, match="stop here"):
        factory.load_engine(beam, needs=())  # asked for: as given (the pipeline's own rule)
    assert asked == [("beam_search",), (), ()]
