"""The four loss aggregations, clipping with epsilon_high and the k3 KL, checked by hand."""

import math

import pytest
import torch

from appliance.grpo.loss import StepNormalizer, aggregate, per_token_loss, policy_loss

MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
ADVANTAGES = torch.tensor([1.0, -2.0])
NORMALIZER = StepNormalizer(sequences=2, tokens=5, micro_batches=1, max_new_tokens=4)


def _on_policy_loss(loss_type):
    logp = torch.zeros(2, 3, requires_grad=True)
    return logp, policy_loss(
        logp, logp.detach(), ADVANTAGES, MASK, loss_type, NORMALIZER, epsilon=0.2, epsilon_high=0.28
    )


# With ratio 1 every token's loss is -A: row 0 gives [-1, -1], row 1 gives [2, 2, 2]; masked sum 4.
@pytest.mark.parametrize(
    "loss_type, expected",
    [
        ("grpo", (-1.0 + 2.0) / 2),  # mean of per-sequence token means
        ("bnpo", 4.0 / 5),  # over the 5 real tokens of the batch
        ("dr_grpo", 4.0 / (2 * 4)),  # over N * max_new_tokens
        ("dapo", 4.0 / 5),  # over the step's 5 tokens
    ],
)
def test_aggregations(loss_type, expected):
    _, output = _on_policy_loss(loss_type)
    assert float(output.loss.detach()) == pytest.approx(expected)


def test_grpo_gradient_weights_tokens_by_sequence_length():
    logp, output = _on_policy_loss("grpo")
    output.loss.backward()
    # d/dlogp of -A * ratio / |o_i| / N: row 0 has 2 tokens, row 1 has 3.
    assert logp.grad[0].tolist() == pytest.approx([-1.0 / 2 / 2, -1.0 / 2 / 2, 0.0])
    assert logp.grad[1].tolist() == pytest.approx([2.0 / 3 / 2] * 3)


def test_dapo_gradient_is_the_same_for_every_token():
    logp, output = _on_policy_loss("dapo")
    output.loss.backward()
    assert logp.grad[0, :2].tolist() == pytest.approx([-1.0 / 5] * 2)
    assert logp.grad[1].tolist() == pytest.approx([2.0 / 5] * 3)


def test_micro_batches_add_up_to_the_whole_step():
    logp = torch.log(torch.tensor([[0.5, 0.4, 0.3], [0.2, 0.6, 0.7]]))
    old = torch.log(torch.tensor([[0.45, 0.5, 0.3], [0.25, 0.5, 0.6]]))
    for loss_type in ("grpo", "dr_grpo", "dapo"):
        whole = policy_loss(logp, old, ADVANTAGES, MASK, loss_type, NORMALIZER, 0.2, 0.28).loss
        split = StepNormalizer(2, 5, 2, 4)
        parts = sum(
            policy_loss(
                logp[i : i + 1], old[i : i + 1], ADVANTAGES[i : i + 1], MASK[i : i + 1], loss_type, split, 0.2, 0.28
            ).loss
            for i in range(2)
        )
        assert float(parts) == pytest.approx(float(whole)), loss_type


def test_clipping_is_asymmetric_with_epsilon_high():
    advantage = torch.tensor([1.0])
    mask = torch.ones(1, 1)
    ratio_125 = torch.log(torch.tensor([[1.25]]))
    zero = torch.zeros(1, 1)
    # 1.25 is inside [0.8, 1.28]: not clipped with epsilon_high 0.28 ...
    loss, _, _, clipped = per_token_loss(ratio_125, zero, advantage, mask, epsilon=0.2, epsilon_high=0.28)
    assert float(loss) == pytest.approx(-1.25) and not bool(clipped)
    # ... but clipped to 1.2 with the symmetric epsilon.
    loss, _, _, clipped = per_token_loss(ratio_125, zero, advantage, mask, epsilon=0.2, epsilon_high=None)
    assert float(loss) == pytest.approx(-1.2) and bool(clipped)


def test_clipping_only_binds_in_the_direction_of_the_advantage():
    mask = torch.ones(1, 1)
    zero = torch.zeros(1, 1)
    high = torch.tensor([[0.5]])  # ratio e^0.5 = 1.6487
    low = torch.tensor([[-0.5]])  # ratio e^-0.5 = 0.6065
    loss, _, _, clipped = per_token_loss(high, zero, torch.tensor([1.0]), mask, 0.2, 0.28)
    assert float(loss) == pytest.approx(-1.28) and bool(clipped)
    loss, _, _, clipped = per_token_loss(high, zero, torch.tensor([-1.0]), mask, 0.2, 0.28)
    assert float(loss) == pytest.approx(math.exp(0.5)) and not bool(clipped)
    loss, _, _, clipped = per_token_loss(low, zero, torch.tensor([-1.0]), mask, 0.2, 0.28)
    assert float(loss) == pytest.approx(0.8) and bool(clipped)


def test_k3_kl_term():
    logp = torch.zeros(1, 2)
    ref = torch.tensor([[0.5, 0.0]])
    loss, kl, _, _ = per_token_loss(
        logp, logp, torch.tensor([0.0]), torch.ones(1, 2), 0.2, 0.28, beta=0.1, ref_logp=ref
    )
    assert kl[0].tolist() == pytest.approx([math.exp(0.5) - 0.5 - 1.0, 0.0])
    assert loss[0].tolist() == pytest.approx([0.1 * (math.exp(0.5) - 1.5), 0.0])


def test_importance_weights_scale_the_surrogate():
    loss, _, _, _ = per_token_loss(
        torch.zeros(1, 2),
        torch.zeros(1, 2),
        torch.tensor([2.0]),
        torch.ones(1, 2),
        0.2,
        0.28,
        importance_weights=torch.tensor([[0.5, 1.0]]),
    )
    assert loss[0].tolist() == pytest.approx([-1.0, -2.0])


def test_unknown_loss_type_names_the_choices():
    with pytest.raises(ValueError, match="grpo, bnpo, dr_grpo, dapo"):
        aggregate(torch.zeros(1, 1), torch.ones(1, 1), "ppo", NORMALIZER)
