"""`llamacpp.grammar_step_limit_s` (issue 35): the config's bound on one token of a large grammar reaches the
worker's argv only when set (the worker's own default otherwise), and the config refuses a bound <= 0. The
bound itself is tested on the real worker (`tests/integration/test_slow_lane_worker.py`)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tests.unit.llamacpp_argv import flag_value
from tests.unit.llamacpp_argv import llamacpp_argv as argv


def test_the_bound_reaches_the_worker_only_when_set() -> None:
    assert "--grammar-step-limit-s" not in argv()
    assert flag_value(argv(grammar_step_limit_s=2.5), "--grammar-step-limit-s") == "2.5"


def test_a_bound_of_zero_is_refused() -> None:
    with pytest.raises(ValidationError, match="grammar_step_limit_s"):
        argv(grammar_step_limit_s=0)
