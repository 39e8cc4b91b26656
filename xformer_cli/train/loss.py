"""Label-smoothed cross-entropy (section 5.4, after Szegedy et al. 2016).

The target distribution puts 1 - eps on the gold token and spreads eps uniformly over
the vocabulary; padding positions contribute nothing. The loss comes back summed so the
caller can normalise by the real number of target tokens across accumulated batches.

The gradient is written by hand: d loss / d logits = softmax(logits) - q, with q the
smoothed target. Autograd would instead run separate backward passes for log_softmax,
gather and mean over the (tokens x vocabulary) matrix; on a CPU those memory-bound
passes cost about a quarter of a small model's training step.
"""

from __future__ import annotations

import torch
from torch import Tensor


class _LabelSmoothedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float, pad_id: int):
        # Half-precision logits are upcast: the softmax over a large vocabulary needs fp32.
        lprobs = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
        keep = (target != pad_id).unsqueeze(-1)
        nll = -lprobs.gather(-1, target.unsqueeze(-1))
        uniform = -lprobs.mean(dim=-1, keepdim=True)  # cross-entropy against the uniform distribution
        loss = ((1.0 - epsilon) * nll + epsilon * uniform).masked_fill(~keep, 0.0).sum()
        nll_sum = nll.masked_fill(~keep, 0.0).sum()
        ctx.save_for_backward(lprobs, target, keep)
        ctx.epsilon, ctx.logits_dtype = epsilon, logits.dtype
        ctx.mark_non_differentiable(nll_sum)
        return loss, nll_sum

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor):
        lprobs, target, keep = ctx.saved_tensors
        eps = ctx.epsilon
        grad = lprobs.exp_()  # reuses the saved buffer: this graph is never backpropagated twice
        grad.sub_(eps / grad.size(-1))
        grad.scatter_add_(-1, target.unsqueeze(-1), torch.full_like(lprobs[..., :1], eps - 1.0))
        grad.mul_(keep * grad_loss)
        return grad.to(ctx.logits_dtype), None, None, None


def label_smoothed_nll(logits: Tensor, target: Tensor, epsilon: float, pad_id: int) -> tuple[Tensor, Tensor]:
    """(..., V) logits and (...) gold ids -> (smoothed loss sum, plain NLL sum) over non-pad tokens."""
    return _LabelSmoothedCrossEntropy.apply(logits, target, epsilon, pad_id)
