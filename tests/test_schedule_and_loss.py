import math

import pytest
import torch
import torch.nn.functional as F

from xformer_cli.train.loss import label_smoothed_nll
from xformer_cli.train.schedule import NoamSchedule, noam_lr


def test_noam_peaks_at_warmup_for_the_paper_base_model():
    peak = 512 ** -0.5 * 4000 ** -0.5
    assert noam_lr(4000, 512, 4000) == pytest.approx(peak)
    assert noam_lr(2000, 512, 4000) == pytest.approx(peak / 2)  # linear warm-up
    assert noam_lr(16000, 512, 4000) == pytest.approx(peak / 2)  # inverse-sqrt decay
    assert max(noam_lr(s, 512, 4000) for s in range(1, 20000, 7)) <= peak + 1e-12
    assert noam_lr(4000, 512, 4000, scale=2.0) == pytest.approx(2 * peak)


def test_noam_schedule_sets_the_optimizer_lr_and_round_trips_its_state():
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=0.0)
    sched = NoamSchedule(opt, d_model=512, warmup=10)
    for _ in range(3):
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(512 ** -0.5 * 3 * 10 ** -1.5)
    again = NoamSchedule(opt, d_model=512, warmup=10)
    again.load_state_dict(sched.state_dict())
    assert again.step() == pytest.approx(noam_lr(4, 512, 10))


def test_label_smoothing_against_a_hand_computed_case():
    # Vocabulary of 4, gold token 2, eps 0.1: q = 0.9 on gold + 0.1/4 everywhere.
    logits = torch.log(torch.tensor([[0.1, 0.2, 0.6, 0.1]]))  # already normalised
    loss, nll = label_smoothed_nll(logits, torch.tensor([2]), epsilon=0.1, pad_id=0)
    expected = 0.9 * -math.log(0.6) + 0.1 * -(math.log(0.1) + math.log(0.2) + math.log(0.6) + math.log(0.1)) / 4
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert nll.item() == pytest.approx(-math.log(0.6), rel=1e-6)


def test_padding_is_ignored_and_matches_torch_cross_entropy():
    torch.manual_seed(3)
    logits = torch.randn(3, 6, 20, dtype=torch.float64, requires_grad=True)
    target = torch.randint(1, 20, (3, 6))
    target[0, 4:] = 0
    target[2, 1:] = 0
    loss, _ = label_smoothed_nll(logits, target, 0.1, pad_id=0)
    loss.backward()
    ref_logits = logits.detach().clone().requires_grad_()
    ref = F.cross_entropy(ref_logits.view(-1, 20), target.view(-1), ignore_index=0, label_smoothing=0.1, reduction="sum")
    ref.backward()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-9)
    torch.testing.assert_close(logits.grad, ref_logits.grad)  # the hand-written gradient
    assert logits.grad[2, 1:].abs().max().item() == 0.0


def test_no_smoothing_is_plain_nll():
    logits = torch.randn(5, 9)
    target = torch.randint(1, 9, (5,))
    loss, nll = label_smoothed_nll(logits, target, 0.0, pad_id=0)
    assert loss.item() == pytest.approx(F.cross_entropy(logits, target, reduction="sum").item(), rel=1e-6)
    assert loss.item() == pytest.approx(nll.item(), rel=1e-6)
