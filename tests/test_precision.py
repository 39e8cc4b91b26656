"""Precision: detection from the CPU's flags, bf16 training that resumes exactly, bf16 and int8
translation, the fast dropout and the blocked loss, and the progress bar's true limit."""

import json
import time

import pytest
import torch
import torch.nn.functional as F

from xformer_cli.decode.translator import Translator
from xformer_cli.device import (CPU_FLAGS_MASK_ENV, EMULATED_ON_CPU, cpu_flags, mask_flags, pick_device,
                                resolve_decode_precision, resolve_precision)
from xformer_cli.errors import XformerError
from xformer_cli.model.dropout import dropout, keep_mask
from xformer_cli.checkpoint_file import load_checkpoint
from xformer_cli import device as device_module
from xformer_cli.config import TrainConfig
from xformer_cli.train import run_plan
from xformer_cli.train.distributed import Distributed
from xformer_cli.train.loss import label_smoothed_nll
from xformer_cli.train.progress import RunProgress
from xformer_cli.train.trainer import train

from helpers import assert_one_line_error, head, losses, quiet, tiny_config, xformer

CPU = torch.device("cpu")
SAPPHIRE_RAPIDS = {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_int8", "avx512_vnni", "amx_tile"}
ZEN4 = {"avx2", "avx512f", "avx512_bf16", "avx512_vnni"}
ZEN3 = {"avx2", "fma", "sse4_2"}  # no AVX-512 at all
ARM_WITH_BF16 = {"fp", "asimd", "bf16", "i8mm", "asimddp"}


@pytest.mark.parametrize("flags, expected", [
    (SAPPHIRE_RAPIDS, "bf16"), (ZEN4, "bf16"), (ARM_WITH_BF16, "bf16"), (ZEN3, "fp32"), (set(), "fp32"),
])
def test_auto_follows_the_cpu_flags(flags, expected):
    precision, why = resolve_precision("auto", CPU, flags)
    assert precision == expected
    assert ("natively" in why) == (expected == "bf16")
    assert resolve_decode_precision("auto", CPU, flags)[0] == expected


def test_explicit_choices_are_kept_and_warned_about_when_emulated():
    assert resolve_precision("fp32", CPU, SAPPHIRE_RAPIDS) == ("fp32", "asked for")
    precision, why = resolve_precision("bf16", CPU, ZEN3)
    assert precision == "bf16" and "slower" in why
    assert resolve_precision("bf16", CPU, ZEN4) == ("bf16", "asked for")
    assert "slow" in resolve_precision("fp16", CPU, ZEN4)[1]  # no avx512_fp16 / amx_fp16
    assert "slow" in resolve_decode_precision("int8", CPU, ZEN3)[1]  # no VNNI
    assert resolve_decode_precision("int8", CPU, ZEN4)[0] == "int8"
    assert resolve_decode_precision("fp16", CPU, ZEN4) == ("fp16", EMULATED_ON_CPU.format("fp16"))
    assert resolve_decode_precision("fp16", CPU, SAPPHIRE_RAPIDS | {"avx512_fp16"}) == ("fp16", "asked for")
    assert resolve_decode_precision("bf16", CPU, ZEN3) == ("bf16", EMULATED_ON_CPU.format("bf16"))
    with pytest.raises(XformerError, match="fp64"):
        resolve_precision("fp64", CPU)
    with pytest.raises(XformerError, match="--precision"):
        resolve_decode_precision("fp64", CPU)


# -- CUDA: the compute capability decides ---------------------------------------------------------

CUDA = torch.device("cuda")
CARDS = [  # (name, compute capability, training's auto, translation's auto)
    ("NVIDIA GeForce GTX 1080", (6, 1), "fp32", "fp32"),  # Pascal: no tensor cores
    ("Tesla V100-SXM2-16GB", (7, 0), "fp16", "fp16"),
    ("Tesla T4", (7, 5), "fp16", "fp16"),
    ("NVIDIA A100-SXM4-40GB", (8, 0), "bf16", "bf16"),
    ("NVIDIA GeForce RTX 3090", (8, 6), "bf16", "bf16"),
    ("NVIDIA H100 80GB HBM3", (9, 0), "bf16", "bf16"),
]


def fake_gpu(monkeypatch: pytest.MonkeyPatch, name: str, capability: tuple[int, int]) -> None:
    """torch sees one CUDA device of this name and compute capability (no GPU needed)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)


@pytest.mark.parametrize("name, capability, training, translation", CARDS)
def test_auto_on_cuda_follows_the_compute_capability(monkeypatch, name, capability, training, translation):
    fake_gpu(monkeypatch, name, capability)
    precision, why = resolve_precision("auto", CUDA)
    assert precision == training
    assert name in why and f"compute capability {capability[0]}.{capability[1]}" in why  # the log line's reason
    assert ("loss scaling" in why) == (training == "fp16")  # the trainer's GradScaler is on exactly for fp16
    assert resolve_precision("auto", CUDA, SAPPHIRE_RAPIDS) == (precision, why)  # the CPU's flags play no part
    assert resolve_precision("auto", torch.device("cuda:1"))[0] == training
    chosen, decode_why = resolve_decode_precision("auto", CUDA, ZEN3)
    assert chosen == translation and name in decode_why
    assert ("fp16 weights" in decode_why) == (translation == "fp16")


def test_explicit_choices_on_cuda_are_kept_and_warned_about_when_emulated(monkeypatch):
    fake_gpu(monkeypatch, "Tesla T4", (7, 5))
    assert resolve_precision("fp16", CUDA) == ("fp16", "asked for")
    precision, why = resolve_precision("bf16", CUDA)
    assert precision == "bf16" and "no bf16 tensor cores" in why and "Tesla T4" in why
    assert resolve_decode_precision("bf16", CUDA)[1] == why
    assert resolve_precision("fp32", CUDA) == ("fp32", "asked for")  # no TF32 before compute capability 8.0
    fake_gpu(monkeypatch, "NVIDIA GeForce GTX 1080", (6, 1))
    assert "no fp16 tensor cores" in resolve_precision("fp16", CUDA)[1]
    fake_gpu(monkeypatch, "NVIDIA A100-SXM4-40GB", (8, 0))
    assert resolve_precision("fp32", CUDA) == ("fp32", "asked for (TF32 tensor cores for the matmuls on the "
                                                       "NVIDIA A100-SXM4-40GB, compute capability 8.0)")
    assert resolve_decode_precision("fp32", CUDA) == ("fp32", "asked for")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(XformerError, match="CUDA is not available"):
        resolve_precision("auto", CUDA)


# -- XFORMER_CPU_FLAGS_MASK: one machine makes another's choices ---------------------------------

def test_mask_flags_takes_names_and_patterns():
    flags = SAPPHIRE_RAPIDS | {"fma", "avx_vnni"}
    assert mask_flags(flags, "") == flags
    assert mask_flags(flags, "avx512* amx*,avx_vnni") == {"avx2", "fma"}
    assert mask_flags(flags, "amx_bf16") == flags - {"amx_bf16"}
    assert mask_flags(flags, "avx512") == flags  # a name is matched whole, not as a prefix


def test_the_mask_hides_flags_from_every_choice(monkeypatch):
    monkeypatch.setattr("xformer_cli.device.proc_cpu_flags", lambda: frozenset(SAPPHIRE_RAPIDS | {"fma"}))
    monkeypatch.delenv(CPU_FLAGS_MASK_ENV, raising=False)
    assert resolve_precision("auto", CPU)[0] == resolve_decode_precision("auto", CPU)[0] == "bf16"
    monkeypatch.setenv(CPU_FLAGS_MASK_ENV, "avx512* amx* avx_vnni")  # an AVX2-only machine, read at every call
    assert cpu_flags() == {"avx2", "fma"}
    assert resolve_precision("auto", CPU) == ("fp32", "the CPU has no native bf16 (no amx_bf16 / avx512_bf16 flag)")
    assert resolve_decode_precision("auto", CPU)[0] == "fp32"
    assert "slower" in resolve_precision("bf16", CPU)[1]
    assert "no int8 dot-product" in resolve_decode_precision("int8", CPU)[1]


def test_cpu_flags_are_read_from_proc_cpuinfo(monkeypatch):
    monkeypatch.delenv(CPU_FLAGS_MASK_ENV, raising=False)
    flags = cpu_flags()
    with open("/proc/cpuinfo", encoding="utf-8") as handle:
        text = handle.read()
    for flag in ("avx512_bf16", "amx_bf16", "avx2"):
        assert (flag in flags) == (f" {flag}" in text)


@pytest.mark.slow
@pytest.mark.parametrize("value", ["fp64", "bf61", "BF16"])
def test_a_bad_precision_is_one_line_naming_the_key(tmp_path, value):
    proc = xformer("train", "-c", "configs/multi30k.yaml", "--set", f"train.precision={value}",
                   "--set", f"run_dir={tmp_path / 'run'}")
    assert_one_line_error(proc, "train.precision", value)
    assert not (tmp_path / "run").exists()
    bad = xformer("translate", "-m", tmp_path / "none.pt", "--precision", value, stdin=b"a\n")
    assert_one_line_error(bad, "--precision")


@pytest.mark.slow
def test_bf16_training_resumes_exactly_and_records_its_precision(small_corpus, tmp_path):
    bf16 = {"train.precision": "bf16"}
    whole = train(tiny_config(small_corpus, tmp_path / "a", **bf16, **{"train.max_steps": 12}), log=quiet, progress=False)
    first = train(tiny_config(small_corpus, tmp_path / "b", **bf16, **{"train.max_steps": 6}), log=quiet, progress=False)
    resumed = train(tiny_config(small_corpus, tmp_path / "b", **bf16, **{"train.max_steps": 12}), log=quiet, progress=False)
    assert (whole.steps, first.steps, resumed.steps) == (12, 6, 12)
    a, b = losses(tmp_path / "a"), losses(tmp_path / "b")
    for step in range(7, 13):
        assert b[step] == a[step], step  # bit-identical: same kernels, same random draws
    wa = load_checkpoint(tmp_path / "a" / "last.pt")
    wb = load_checkpoint(tmp_path / "b" / "last.pt")
    assert wa["precision"] == wb["precision"] == "bf16"
    assert all(p.dtype == torch.float32 for p in wa["model"].values() if p.is_floating_point())  # fp32 master weights
    for key in wa["model"]:
        assert torch.equal(wa["model"][key], wb["model"][key]), key
    # and it differs from an fp32 run: autocast really was on
    fp32 = train(tiny_config(small_corpus, tmp_path / "c", **{"train.precision": "fp32", "train.max_steps": 12}),
                 log=quiet, progress=False)
    assert fp32.steps == 12 and losses(tmp_path / "c")[12] != a[12]


@pytest.mark.slow
@pytest.mark.parametrize("flags, expected, why", [
    (ZEN4, "bf16", "the CPU computes bf16 natively (avx512_bf16)"),
    (ZEN3, "fp32", "the CPU has no native bf16 (no amx_bf16 / avx512_bf16 flag)"),
])
def test_the_run_says_which_precision_it_chose(small_corpus, tmp_path, monkeypatch, flags, expected, why):
    monkeypatch.setattr("xformer_cli.device.proc_cpu_flags", lambda: frozenset(flags))  # this machine, faked
    monkeypatch.delenv(CPU_FLAGS_MASK_ENV, raising=False)
    lines = []
    train(tiny_config(small_corpus, tmp_path / "run", **{"train.max_steps": 2, "train.precision": "auto"}), log=lines.append,
          progress=False)
    assert [line for line in lines if line.startswith("precision:")] == [f"precision: auto -> {expected} ({why})"]
    config_text = (tmp_path / "run" / "config.yaml").read_text()
    assert config_text.startswith(f"# train.precision auto ran as {expected} on this machine\n")
    rows = [row for row in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) if "valid_bleu" in row]
    assert rows and all(row["precision"] == expected for row in rows)
    assert load_checkpoint(tmp_path / "run" / "last.pt")["precision"] == expected


# -- translation -------------------------------------------------------------------------------------

HOSTILE = [b"A dog runs.", b"", b"\x00\x07ctrl\x1b[31m chars", b"bad \xff\xfe utf8", b" ".join([b"dog"] * 600), b"\r",
           b"Two men."]


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16", "int8"])
def test_every_precision_keeps_one_line_per_input_line(trained_run, precision):
    stdin = b"\n".join(HOSTILE * 2) + b"\n"
    proc = xformer("translate", "-m", trained_run / "best.pt", "-b", "2", "--precision", precision,
                   "--max-len-a", "0", "--max-len-b", "8", "--invalid-utf8", "replace", stdin=stdin)
    assert proc.returncode == 0, proc.stderr.decode()
    out = proc.stdout.decode().split("\n")
    assert len(out) == len(HOSTILE) * 2 + 1 and out[-1] == ""
    assert [o == "" for o in out[:-1]] == [line.strip() == b"" for line in HOSTILE * 2]


@pytest.mark.slow
def test_bf16_translation_keeps_bf16_weights_and_leaves_a_training_model_alone(trained_run):
    fp32 = Translator.from_checkpoint(trained_run / "best.pt", device="cpu", precision="fp32")
    bf16 = Translator(fp32.model, fp32.tokenizer, fp32.decode, CPU, precision="bf16")
    assert next(bf16.model.parameters()).dtype == torch.bfloat16
    assert next(fp32.model.parameters()).dtype == torch.float32  # a copy was made, the original kept
    lines = ["A dog runs.", "Two men are talking in a park near a big fountain.", ""]
    for beam in (1, 4, 10):  # 10 beams: more queries than the plain decoding-step attention takes
        out = bf16.translate(lines, beam_size=beam)
        assert len(out) == 3 and out[0] and out[1] and out[2] == ""


@pytest.mark.slow
def test_fp16_translation_translates_as_fp32_does(trained_run, small_corpus):
    """fp16 weights (what precision auto gives a CUDA 7.x card): the search still gets fp32
    log-probabilities, and the outputs are fp32's. fp16 keeps 11 significant bits (bf16 8),
    so on this barely trained model a few near-ties may break the other way: 94-95 of 100 lines
    agreed with the batches sorted by target length, every difference one "Ein" more or less in
    a run of them.
    A search that lost fp32 log-probabilities would disagree on far more."""
    src = head(small_corpus / "test2016.en", 100)
    fp32 = Translator.from_checkpoint(trained_run / "best.pt", device="cpu", precision="fp32")
    fp16 = Translator(fp32.model, fp32.tokenizer, fp32.decode, CPU, precision="fp16")
    assert next(fp16.model.parameters()).dtype == torch.float16
    assert next(fp32.model.parameters()).dtype == torch.float32
    src_ids = torch.tensor([[5, 6, 7, 3]])
    with torch.no_grad():  # as search runs it
        memory = fp16.model.encode(src_ids)
        cache = [{} for _ in fp16.model.decoder_layers]
        logits = fp16.model.decode_step(torch.tensor([[2]]), memory, fp16.model.padding_mask(src_ids), cache)
    assert memory.dtype == torch.float16
    scored = logits[..., fp16.model.output_pieces] if fp16.model.cfg.output_pieces else logits
    assert logits.dtype == torch.float32 and torch.isfinite(scored).all()  # the others: -inf (restrict_output)
    for beam in (1, 4):
        same = sum(a == b for a, b in zip(fp32.translate(src, beam_size=beam), fp16.translate(src, beam_size=beam)))
        assert same >= 90, (beam, same)


# -- the pieces that make bf16 fast ------------------------------------------------------------------

def test_fast_dropout_keeps_the_right_fraction_scales_and_is_seeded():
    torch.manual_seed(5)
    keep = keep_mask(torch.Size([400, 500]), 0.1, CPU)
    assert keep.dtype == torch.bool and keep.shape == (400, 500)
    assert abs(keep.float().mean().item() - 0.9) < 0.005
    torch.manual_seed(5)
    assert torch.equal(keep, keep_mask(torch.Size([400, 500]), 0.1, CPU))
    x = torch.ones(300, 300, requires_grad=True)
    y = dropout(x, 0.3, training=True)
    kept = y != 0
    assert torch.allclose(y[kept], torch.full_like(y[kept], 1 / (1 - round(0.3 * 65536) / 65536)))
    y.sum().backward()
    assert torch.equal(x.grad != 0, kept)  # the gradient flows through the same mask
    assert dropout(x, 0.3, training=False) is x


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fast_dropout_equals_the_bool_mask_product_bit_for_bit(dtype):
    """The mask goes in as 0/1 of the activations' dtype (the fast same-dtype product): forward and
    gradient must be exactly what multiplying by the bool mask gives."""
    x = torch.randn(37, 19, 64).to(dtype).requires_grad_()
    upstream = torch.randn(37, 19, 64).to(dtype)
    torch.manual_seed(11)
    y = dropout(x, 0.1, training=True)
    y.backward(upstream)
    torch.manual_seed(11)
    keep = keep_mask(x.shape, 0.1, CPU)
    scale = 1 / (1 - round(0.1 * 65536) / 65536)
    assert y.dtype == dtype
    assert torch.equal(y, torch.mul(x.detach(), keep).mul_(scale))
    assert torch.equal(x.grad, torch.mul(upstream, keep).mul_(scale))


def test_blocked_loss_on_bf16_logits_matches_fp32_autograd():
    torch.manual_seed(1)
    logits = torch.randn(700, 50, dtype=torch.bfloat16, requires_grad=True)  # 700 rows: three blocks
    target = torch.randint(1, 50, (700,))
    target[::7] = 0
    loss, nll = label_smoothed_nll(logits, target, 0.1, pad_id=0)
    (loss / 100).backward()
    ref_logits = logits.detach().float().requires_grad_()
    ref = F.cross_entropy(ref_logits, target, ignore_index=0, label_smoothing=0.1, reduction="sum")
    (ref / 100).backward()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
    assert logits.grad.dtype == torch.bfloat16
    torch.testing.assert_close(logits.grad.float(), ref_logits.grad, atol=1e-4, rtol=1e-2)
    with torch.no_grad():  # validation: no gradient is computed or kept
        assert label_smoothed_nll(logits, target, 0.1, pad_id=0)[0].item() == pytest.approx(loss.item())


def test_progress_counts_toward_the_limit_that_ends_the_run():
    start = time.time() - 60  # one minute in
    timed = RunProgress(max_steps=100_000, max_minutes=25, step=0, enabled=False, started=start)
    assert timed.unit == "min" and timed.total == 25
    timed.update(100)  # 100 steps a minute: 2500 by the deadline, far below 100k
    assert timed.unit == "min" and timed.position == pytest.approx(1.0, abs=0.05)
    short = RunProgress(max_steps=150, max_minutes=25, step=0, enabled=False, started=start)
    short.update(100)  # the step limit comes first: count steps
    assert short.unit == "steps" and short.total == 150 and short.position == 100
    untimed = RunProgress(max_steps=300, max_minutes=0, step=20, enabled=False)
    untimed.update(21)
    assert untimed.unit == "steps" and untimed.position == 21 and untimed.total == 300


def test_progress_follows_a_plan_that_moves():
    """Seen in a main job: planned 982 steps at the start, the keeper raised the plan to 3966,
    and the bar stayed at "x/982" (full for three quarters of the run)."""
    bar = RunProgress(max_steps=982, max_minutes=25, step=0, enabled=False, started=time.time() - 60)
    bar.update(400)  # 400 steps a minute: the plan ends the run first
    assert bar.unit == "steps" and bar.total == 982
    bar.retarget(3966)
    bar.update(1000)
    assert bar.total == 3966 and bar.position == 1000 and bar.bar.total == 3966
    minutes = RunProgress(max_steps=100_000, max_minutes=25, step=0, enabled=False)
    minutes.retarget(50_000)  # counting minutes: the total stays the budget
    assert minutes.unit == "min" and minutes.total == 25


def test_a_planned_run_counts_steps_toward_its_plan_whatever_the_pace():
    """The README main job's bar flipped between "x/4240 steps" and "2.9/25.0 min" (and showed
    00:00 elapsed after each flip) as the pace moved around the plan. With a plan, the bar
    counts steps toward it: slower or faster than planned, the unit and the clock stay."""
    now = time.time()
    bar = RunProgress(max_steps=4240, max_minutes=25, step=0, enabled=True, started=now - 60, planned=True)
    try:
        assert bar.unit == "steps" and bar.total == 4240
        opened = bar.bar.start_t
        for step in (100, 200, 300):  # 100 to 300 steps a minute: 2500 to 7500 by the deadline
            bar.update(step)
            assert bar.unit == "steps" and bar.position == step and bar.bar.n == step
        assert bar.bar.start_t == opened  # never reset
    finally:
        bar.close()
    unplanned = RunProgress(max_steps=2000, max_minutes=25, step=0, enabled=True, started=now - 60)
    try:
        unplanned.update(100)  # 2500 steps by the deadline: the step limit first, a switch from minutes
        assert unplanned.unit == "steps" and unplanned.bar.start_t == pytest.approx(now - 60)  # its clock kept
    finally:
        unplanned.close()


def test_a_resumed_runs_progress_paces_this_process_and_counts_the_minutes_trained_before():
    """Resumed at step 1000 after 9 minutes trained; this process has run 1 minute (100 steps).
    The bar shows the run's 10 minutes, and judges the limit by this process's pace alone."""
    now = time.time()
    resumed = RunProgress(max_steps=100_000, max_minutes=25, step=1000, enabled=False, started=now - 600,
                          trained_before=540)
    resumed.update(1100)  # 100 steps a minute, 15 minutes left: 2600 by the deadline
    assert resumed.unit == "min" and resumed.position == pytest.approx(10.0, abs=0.05)
    capped = RunProgress(max_steps=2000, max_minutes=25, step=1000, enabled=False, started=now - 600,
                         trained_before=540)
    capped.update(1100)  # 2600 > 2000: the step limit ends it first
    assert capped.unit == "steps" and capped.position == 1100


def test_under_cpu_autocast_only_the_matrix_products_run_in_bf16():
    """CPU autocast's op lists differ from CUDA's: softmax, log-softmax and layer_norm are not
    in its fp32 list, so they run in whatever dtype reaches them. The model keeps them fp32:
    LayerNorm sees the fp32 residual stream, attention scores are computed in fp32, the loss
    upcasts the logits. Checked here on the dtypes that actually flow."""
    from xformer_cli.model.transformer import ModelConfig, Transformer

    torch.manual_seed(0)
    model = Transformer(ModelConfig(d_model=32, d_ff=64, n_heads=4, encoder_layers=1, decoder_layers=1), src_vocab=50)
    seen: dict[str, set] = {"norm": set(), "linear": set()}
    for module in model.modules():
        if isinstance(module, torch.nn.LayerNorm):
            module.register_forward_hook(lambda m, i, o: seen["norm"].update({i[0].dtype, o.dtype}))
        elif isinstance(module, torch.nn.Linear):
            module.register_forward_hook(lambda m, i, o: seen["linear"].add(o.dtype))
    src, tgt = torch.randint(4, 50, (3, 7)), torch.randint(4, 50, (3, 5))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(src, tgt)
    loss, _ = label_smoothed_nll(logits, tgt, 0.1, pad_id=0)
    loss.backward()
    assert seen["norm"] == {torch.float32}
    assert seen["linear"] == {torch.bfloat16}
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
    assert all(p.grad.dtype == torch.float32 for p in model.parameters() if p.grad is not None)  # fp32 master weights


def test_a_cuda_device_is_configured_without_cudnn_attention(monkeypatch: pytest.MonkeyPatch) -> None:
    """On an H100 the cuDNN attention backend diverged in bf16 and rebuilt a graph per batch
    shape (docs/benchmarks/gpu.md, "the first lease"): every CUDA device pick_device hands out has it off,
    and TF32 on.
    The flags are process-wide settings that need no GPU to read or write."""
    saved = (torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.matmul.allow_tf32)
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        torch.backends.cuda.matmul.allow_tf32 = False
        assert pick_device("cpu").type == "cpu" and torch.backends.cuda.cudnn_sdp_enabled()  # CPU: untouched
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        assert pick_device("auto") == torch.device("cuda")
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.matmul.allow_tf32
        assert torch.backends.cuda.mem_efficient_sdp_enabled()  # the backend that trained through
    finally:
        torch.backends.cuda.enable_cudnn_sdp(saved[0])
        torch.backends.cuda.matmul.allow_tf32 = saved[1]


def test_train_device_cuda_without_an_index_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """``train.device: cuda`` (configs/multi30k-gpu.yaml) stopped every run on an H200 (torch
    2.11): torch.cuda.set_device refuses a device without an index. The trainer gives it the
    current one; the fake set_device refuses as torch does."""
    set_to = []

    def set_device(device: torch.device) -> None:
        if device.index is None:
            raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{device}")
        set_to.append(device)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    monkeypatch.setattr(run_plan, "resolve_precision", lambda requested, device: ("bf16", "faked"))
    monkeypatch.setattr(device_module, "configure_cuda", lambda: None)  # process-wide flags: left alone here
    for name, index in (("cuda", 2), ("cuda:1", 1)):
        tc = TrainConfig(device=name, threads=torch.get_num_threads())
        device, precision = run_plan.start_device(tc, Distributed(), lambda line: None)
        assert device == torch.device("cuda", index) and set_to[-1] == device and precision == "bf16"


def test_cuda_asked_for_without_cuda_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(XformerError, match="'cuda:1' was asked for but CUDA is not available"):
        pick_device("cuda:1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(XformerError, match="'cuda:2' was asked for but torch sees 2 GPU"):
        pick_device("cuda:2")


class _FakeLibc:
    def __init__(self, accepts: bool):
        self.calls, self.accepts = [], accepts

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return 1 if self.accepts else 0


def test_a_cpu_training_process_keeps_freed_memory_where_glibc_allows_it():
    from xformer_cli.device import keep_freed_memory

    glibc = _FakeLibc(accepts=True)
    assert keep_freed_memory(glibc) is True
    assert glibc.calls == [(-4, 0), (-1, 2**31 - 1)]  # M_MMAP_MAX 0: no fresh maps; M_TRIM_THRESHOLD: no trim
    assert keep_freed_memory(_FakeLibc(accepts=False)) is False  # a C library that refuses the knob
    assert keep_freed_memory(object()) is False  # one without mallopt (musl, macOS)
