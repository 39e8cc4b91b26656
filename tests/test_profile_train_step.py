"""scripts/profile_train_step.py: where a training step goes, on a CPU here and on CUDA where lent."""

import subprocess
import sys

import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import profile_train_step as profile  # noqa: E402


@pytest.mark.parametrize("name, kind", [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1", "matrix products"),
    ("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNT", "matrix products"),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel)", "attention"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>", "LayerNorm"),
    ("void at::native::multi_tensor_apply_kernel<at::native::FusedAdamMathFunctor<float, 4>>", "optimizer (fused Adam)"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>", "softmax / log-softmax"),
    ("void at::native::fused_dropout_kernel_vec<c10::BFloat16, float, unsigned int, 1, 4, bool>", "dropout"),
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)>", "copies and casts"),
    ("Memcpy HtoD (Pinned -> Device)", "copies and casts"),
    ("Memset (Device)", "memset"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float>>>", "reductions"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>", "other element-wise"),
    ("some_custom_kernel", "other"),
])
def test_cuda_kernels_fall_into_the_kind_of_work_they_do(name, kind):
    assert profile.kernel_category(name) == kind


def test_the_kernel_report_gives_the_busy_share_and_the_kinds_per_step(capsys):
    kernels = {"nvjet_gemm": (30_000.0, 200), "fmha_cutlassF": (10_000.0, 40), "vectorized_elementwise_kernel": (10_000.0, 760)}
    profile.report_kernels(kernels, steps=2, wall=0.050, top=2)
    out = capsys.readouterr().out
    assert "GPU kernel time 25.0 ms a step of 50.0 ms wall: busy 50%" in out and "500 kernels a step" in out
    assert "matrix products                 15.00 ms   60.0% of kernel time     100 kernels" in out
    assert out.count("\n  ") == 3 + 2  # three kinds, then the two longest kernels


@pytest.mark.slow
def test_the_profile_runs_the_trainers_step_in_both_precisions_on_a_cpu(tmp_path):
    proc = subprocess.run([sys.executable, "scripts/profile_train_step.py", "--precision", "fp32", "bf16", "--steps", "2",
                           "--pairs", "400", "--set", "model.d_model=32", "model.d_ff=64", "model.encoder_layers=1",
                           "model.decoder_layers=1", "tokenizer.vocab_size=500"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "model 32 wide, 1+1 layers" in proc.stdout
    for precision in ("fp32", "bf16"):
        assert f"== precision {precision}, output layer 500 pieces: step" in proc.stdout
    assert proc.stdout.count("matrix products") >= 2 and "dropout (step with dropout minus without)" in proc.stdout
