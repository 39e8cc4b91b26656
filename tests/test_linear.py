"""model/linear.py: the bf16 Linear on padded rows computes what F.linear computes."""

import torch
import torch.nn.functional as F

from xformer_cli.model.linear import Linear


def test_padded_bf16_linear_matches_f_linear_forward_and_backward():
    torch.manual_seed(0)
    layer = Linear(32, 48)
    x = torch.randn(5, 13, 32, requires_grad=True)  # 65 rows: not a multiple of 64, so padded
    g = torch.randn(5, 13, 48)
    with torch.autocast("cpu", torch.bfloat16):
        ours = layer(x)
    (ours.float() * g).sum().backward()
    got = (x.grad.clone(), layer.weight.grad.clone(), layer.bias.grad.clone())
    x.grad = layer.weight.grad = layer.bias.grad = None
    with torch.autocast("cpu", torch.bfloat16):
        reference = F.linear(x, layer.weight, layer.bias)
    (reference.float() * g).sum().backward()
    assert ours.dtype == torch.bfloat16 and ours.shape == (5, 13, 48)
    torch.testing.assert_close(ours.float(), reference.float(), atol=2e-2, rtol=2e-2)
    for mine, theirs in zip(got, (x.grad, layer.weight.grad, layer.bias.grad)):
        # both round to bf16, in different orders: within 1% of the gradient's scale
        torch.testing.assert_close(mine, theirs, atol=1e-2 * theirs.abs().max().item(), rtol=0)
        assert mine.dtype == torch.float32  # fp32 master weights get fp32 gradients
