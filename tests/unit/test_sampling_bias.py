"""logit_bias as the sampler chain receives it: bans at -100, ignore_eos's bans, no plain-greedy shortcut."""

from __future__ import annotations

import math

from backends.llamacpp.worker.sampling import SamplingParams, logit_biases


def test_minus_100_bans_and_other_biases_pass_through() -> None:
    params = SamplingParams(logit_bias=((5, -100.0), (7, 100.0), (9, -2.5), (11, 0.0)))
    assert logit_biases(params) == {5: -math.inf, 7: 100.0, 9: -2.5}


def test_a_token_named_twice_keeps_its_last_bias() -> None:
    assert logit_biases(SamplingParams(logit_bias=((3, 1.0), (3, -4.0)))) == {3: -4.0}


def test_ignore_eos_bans_every_end_of_generation_token_whatever_its_bias() -> None:
    params = SamplingParams(ignore_eos=True, logit_bias=((2, 100.0), (8, 1.5)))
    assert logit_biases(params, eog_ids={2, 4}) == {2: -math.inf, 4: -math.inf, 8: 1.5}


def test_without_ignore_eos_the_eog_ids_are_not_touched() -> None:
    assert logit_biases(SamplingParams(), eog_ids={2}) == {}


def test_a_bias_needs_the_sampler_chain_even_for_greedy() -> None:
    assert SamplingParams(temperature=0.0).plain_greedy
    assert not SamplingParams(temperature=0.0, logit_bias=((1, 5.0),)).plain_greedy
