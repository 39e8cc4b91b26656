"""The loss's two paths (blocked for CPUs, one pass for GPUs) compute the same loss and gradient."""

import pytest
import torch

from xformer_cli.errors import XformerError
from xformer_cli.train import loss as loss_module
from xformer_cli.train.loss import forced_path, label_smoothed_nll, loss_path


def _loss_and_grad(path: str, logits: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    leaf = logits.detach().clone().requires_grad_()
    with forced_path(path):
        loss, nll = label_smoothed_nll(leaf, target, 0.1, pad_id=0)
    (loss * 0.37).backward()  # a non-unit upstream gradient: the saved buffer is scaled
    return loss.detach(), nll, leaf.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_pass_equals_blocked_in_loss_and_gradient(dtype):
    torch.manual_seed(0)
    rows = 3 * loss_module._ROWS + 17  # several blocks and a ragged last one
    logits = (torch.randn(rows // 7 + 1, 7, 301) * 3).to(dtype)
    target = torch.randint(1, 301, logits.shape[:2])
    target[0, 3:] = 0
    target[-1, :] = 0
    blocked = _loss_and_grad("blocked", logits, target)
    one_pass = _loss_and_grad("one_pass", logits, target)
    torch.testing.assert_close(one_pass[0], blocked[0], rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(one_pass[1], blocked[1], rtol=1e-5, atol=1e-3)
    assert one_pass[2].dtype == blocked[2].dtype == dtype
    torch.testing.assert_close(one_pass[2], blocked[2], rtol=1e-5, atol=1e-6)  # row for row the same arithmetic
    assert one_pass[2][-1].abs().max().item() == 0.0  # padding rows get no gradient


def test_the_device_picks_the_path_and_a_forced_path_wins():
    assert loss_path(torch.device("cpu")) == "blocked"
    assert loss_path(torch.device("cuda")) == "one_pass"
    with forced_path("one_pass"):
        assert loss_path(torch.device("cpu")) == "one_pass"
        with forced_path("blocked"):
            assert loss_path(torch.device("cuda")) == "blocked"
        assert loss_path(torch.device("cuda")) == "one_pass"
    assert loss_path(torch.device("cpu")) == "blocked"
    with pytest.raises(XformerError, match="loss path"):
        with forced_path("chunked"):
            pass


def test_one_pass_without_gradient_returns_the_same_sums():
    torch.manual_seed(1)
    logits, target = torch.randn(600, 50), torch.randint(0, 50, (600,))
    with torch.no_grad():
        expected = label_smoothed_nll(logits, target, 0.1, pad_id=0)
        with forced_path("one_pass"):
            got = label_smoothed_nll(logits, target, 0.1, pad_id=0)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("upstream", [1 / 523, 0.37, float("nan")])
def test_a_gradient_scale_given_ahead_gives_the_gradient_of_whatever_comes_back(dtype, upstream):
    """The CPU path writes the gradient already times grad_scale; the backward pass then has
    nothing to do when that is what comes back, and rescales when something else does."""
    torch.manual_seed(2)
    logits = (torch.randn(40, 13, 301) * 3).to(dtype)
    target = torch.randint(1, 301, logits.shape[:2])
    target[0, 5:] = 0
    reference = logits.detach().double().requires_grad_()
    label_smoothed_nll(reference, target, 0.1, pad_id=0)[0].mul(upstream).backward()
    leaf = logits.detach().clone().requires_grad_()
    with forced_path("blocked"):
        loss, _ = label_smoothed_nll(leaf, target, 0.1, pad_id=0, grad_scale=torch.ones(()) / 523)
    (loss * upstream).backward() if upstream != 1 / 523 else (loss / 523).backward()
    assert leaf.grad.dtype == dtype
    if upstream != upstream:  # NaN upstream: a NaN gradient, as without the scale (the step skips it)
        assert leaf.grad.isnan().all()
        return
    tolerance = {"rtol": 1e-2, "atol": 1e-5} if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-8}
    torch.testing.assert_close(leaf.grad.double(), reference.grad, **tolerance)
    assert leaf.grad[0, 5:].abs().max().item() == 0.0  # padding positions get no gradient
