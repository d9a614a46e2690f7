"""Turn-level GRPO (algos/turn_grpo.py): hand-computed groups and the rules at the edges."""

from __future__ import annotations

import pytest
import torch

from agentrl.algos.turn_grpo import turn_grpo, turns_reached, turns_to_steps


def test_hand_group():
    # 4 episodes of a 3-turn task: all pass turn 0; two of them pass turn 1; one of those passes turn 2
    passed = [[True, True, True], [True, True, False], [True, False, False], [True, False, False]]
    adv = [a.tolist() for a in turn_grpo(passed, [3, 3, 3, 3])]
    assert all(a[0] == 0 for a in adv)  # turn 0: no spread, no credit (episode-level GRPO would blame it)
    s = float(torch.tensor([1.0, 1.0, 0.0, 0.0]).std())
    assert adv[0][1] == pytest.approx(0.5 / s, rel=1e-5) and adv[2][1] == pytest.approx(-0.5 / s, rel=1e-5)
    s2 = float(torch.tensor([1.0, 0.0]).std())
    assert adv[0][2] == pytest.approx(0.5 / s2, rel=1e-5) and adv[1][2] == pytest.approx(-0.5 / s2, rel=1e-5)
    # after their first failure, episodes 2 and 3 are not judged at turn 2: state diverged
    assert adv[2][2] == 0 and adv[3][2] == 0


def test_cut_off_turn_counts_as_failed_and_small_anchor_sets_get_zero():
    # episode 1 was cut off during turn 1 (reached 2 turns, 1 checked)
    adv = turn_grpo([[True, True], [True]], [2, 2])
    assert adv[0][1] > 0 > adv[1][1] and adv[0][0] == adv[1][0] == 0
    # only one episode reaches turn 1 from the gold state: no baseline, no credit
    adv = turn_grpo([[True, True], [False, False]], [2, 2])
    assert adv[0][1] == 0 and adv[0][0] > 0 > adv[1][0] and adv[1][1] == 0
    assert turn_grpo([[True]], [1])[0].tolist() == [0.0]  # a group of one
    with pytest.raises(ValueError, match="reached"):
        turn_grpo([[True, True]], [1])


def test_turns_reached_and_steps():
    assert turns_reached([True], [0, 0, 1, 1]) == 2  # cut off mid-turn 1
    assert turns_reached([True, False], [0, 1]) == 2
    assert turns_reached([], []) == 0
    assert turns_to_steps(torch.tensor([0.5, -1.0]), [0, 0, 1]).tolist() == [0.5, 0.5, -1.0]
    assert turns_to_steps(torch.tensor([]), []).numel() == 0
