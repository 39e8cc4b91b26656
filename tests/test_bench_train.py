"""scripts/bench_train.py's MFU rule: no MFU against a precision the machine emulates, decided
from the CPU flags or the CUDA compute capability, else from the measured peaks (faked here)."""

import importlib.util
from pathlib import Path

import pytest
import torch

from xformer_cli.device import computes_natively

ROOT = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("bench_train", ROOT / "scripts" / "bench_train.py")
bench_train = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(bench_train)

CPU = torch.device("cpu")
ZEN3 = {"avx2", "fma", "sse4_2"}
ZEN4 = {"avx2", "avx512f", "avx512_bf16", "avx512_vnni"}
SAPPHIRE_RAPIDS = {"avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile"}


@pytest.mark.parametrize("flags, bf16, fp16", [
    (ZEN3, False, False), (ZEN4, True, False), (SAPPHIRE_RAPIDS, True, True),
    (set(), None, None),  # no flags to read (no /proc/cpuinfo): only a measurement can tell
])
def test_native_precisions_follow_the_cpu_flags(flags, bf16, fp16):
    assert computes_natively("fp32", CPU, flags) is True
    assert computes_natively("bf16", CPU, flags) is bf16
    assert computes_natively("fp16", CPU, flags) is fp16


@pytest.mark.parametrize("capability, bf16, fp16", [((6, 1), False, False), ((7, 5), False, True), ((8, 0), True, True)])
def test_native_precisions_follow_the_compute_capability(monkeypatch, capability, bf16, fp16):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "a GPU")
    cuda = torch.device("cuda")
    assert (computes_natively("bf16", cuda), computes_natively("fp16", cuda)) == (bf16, fp16)


FP32_PEAK = 100e9


@pytest.mark.parametrize("native, bf16_peak, emulated", [
    (False, None, True),  # the flags say so: not even timed
    (True, 0.3e9, False),  # the flags say native: a slow timing is noise, not emulation
    (None, 0.3e9, True),  # flags cannot tell: 0.3 GFLOP/s against fp32's 100 is an emulation
    (None, 300e9, False),
])
def test_an_emulated_precision_gets_no_mfu(native, bf16_peak, emulated):
    reason = bench_train.emulated_reason("bf16", native, bf16_peak, FP32_PEAK)
    assert (reason is not None) == emulated
    peaks = {"fp32": FP32_PEAK, **({} if bf16_peak is None else {"bf16": bf16_peak})}
    text = bench_train.mfu_text(78e9, peaks, {"bf16": reason} if reason else {})
    assert text.startswith("78.0% of fp32 peak")
    if emulated:  # the AVX2 EPYC printed "35037.7% of bf16 peak"
        assert "of bf16 peak" not in text and "no bf16 MFU (bf16 emulated)" in text
    else:
        assert f"{78e9 / bf16_peak:5.1%} of bf16 peak" in text


def test_measured_peaks_skip_timing_what_the_flags_call_emulated(monkeypatch):
    timed = []
    monkeypatch.setattr(bench_train, "peak_matmul_flops", lambda device, dtype=torch.float32: timed.append(dtype) or 50e9)
    monkeypatch.setattr(bench_train, "computes_natively", lambda precision, device, flags=None: False)
    peaks, emulated = bench_train.measured_peaks(CPU)
    assert timed == [torch.float32] and set(peaks) == {"fp32"} and set(emulated) == {"bf16"}
    monkeypatch.setattr(bench_train, "computes_natively", lambda precision, device, flags=None: None)
    peaks, emulated = bench_train.measured_peaks(CPU)  # unknown: timed, and 50 is not below fp32's 50
    assert set(peaks) == {"fp32", "bf16"} and emulated == {}


@pytest.mark.parametrize("restrict", [True, False])
def test_benchmarks_build_the_model_the_trainer_trains(restrict):
    """bench_train and profile_train_step time the trainer's model: with model.restrict_output
    its output layer scores the pieces the batches' target side uses (and the special ids)."""
    from types import SimpleNamespace

    from xformer_cli.config import load_config
    from xformer_cli.tokenizer import Tokenizer

    src = [f"the {w} dog runs far away" for w in ("red", "big", "old", "small")] * 20
    tgt = [f"der {w} Hund" for w in ("rote", "grosse", "alte", "kleine")] * 20
    tokenizer = Tokenizer.train(src, tgt, joint=True, vocab_size=60)
    cfg = load_config(str(ROOT / "configs" / "multi30k.yaml"),
                      ["model.d_model=16", "model.d_ff=32", "model.n_heads=2", f"model.restrict_output={restrict}"])
    plan = SimpleNamespace(data=SimpleNamespace(tgt=tokenizer.encode_tgt(tgt)))
    model = bench_train.trainer_model(cfg, tokenizer, plan)
    used = sorted({i for line in plan.data.tgt for i in line} | {0, 1, 2, 3})
    if restrict:
        assert model.output_pieces.tolist() == used and len(used) < tokenizer.tgt_vocab_size
    else:
        assert model.cfg.output_pieces == 0


@pytest.mark.parametrize("auto", ["fp32", "bf16"])
def test_every_system_is_timed_through_the_trainers_own_step(monkeypatch, auto):
    """bench_train times ours and the torch.nn.Transformer peer alike through train/step.py's
    TrainStep (only model and loss differ), so a change to the step moves its figures."""
    from types import SimpleNamespace

    from xformer_cli.config import load_config
    from xformer_cli.data.batching import Batch
    from xformer_cli.tokenizer import Tokenizer
    from xformer_cli.train.step import TrainStep

    src = [f"the {w} dog runs far away" for w in ("red", "big", "old", "small")] * 20
    tokenizer = Tokenizer.train(src, src, joint=True, vocab_size=60)
    cfg = load_config(str(ROOT / "configs" / "multi30k.yaml"),
                      ["model.d_model=16", "model.d_ff=32", "model.n_heads=2", "model.encoder_layers=1",
                       "model.decoder_layers=1", "model.restrict_output=false"])
    plan = SimpleNamespace(declared=lambda max_len: [], static_shapes=False)
    args = SimpleNamespace(compile=False)
    systems, _ = bench_train.build_systems(cfg, args, tokenizer, plan, CPU, auto)
    assert [name for name, *_ in systems] == ["ours-fp32", *(["ours-auto"] if auto != "fp32" else []), "theirs"]
    stepped = []
    real = TrainStep.__call__
    monkeypatch.setattr(TrainStep, "__call__", lambda self, *a: stepped.append(self) or real(self, *a))
    ids = torch.randint(4, tokenizer.src_vocab_size, (4, 6))
    rates = bench_train.time_systems(systems, [Batch(ids, ids, ids, ids.numel())], CPU, rounds=1)
    assert all(isinstance(step, TrainStep) for _, _, step, *_ in systems)
    assert {id(s) for s in stepped} == {id(step) for _, _, step, *_ in systems}
    assert all(rate[0] > 0 for rate in rates.values())
