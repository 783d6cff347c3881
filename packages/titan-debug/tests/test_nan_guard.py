import logging

import pytest
import torch

from titan_debug import NonFiniteError, check_finite


def test_finite_step_passes():
    assert check_finite(1, 2.5, 0.3, "stop")
    assert check_finite(1, torch.tensor(2.5), None, "skip")


def test_stop_names_step_values_and_field():
    with pytest.raises(NonFiniteError) as info:
        check_finite(12, float("nan"), float("inf"), "stop")
    message = str(info.value)
    assert message.startswith("step 12: loss=nan, grad_norm=inf is not finite")
    assert "debug.nan_policy='stop'" in message and "no checkpoint is saved for step 12" in message
    assert isinstance(info.value, FloatingPointError)


def test_skip_warns_and_returns_false(caplog):
    caplog.set_level(logging.WARNING, logger="titan")
    assert check_finite(5, 1.0, torch.tensor(float("-inf")), "skip") is False
    assert "step 5: grad_norm=-inf is not finite; skipping the optimizer step" in caplog.text


def test_unknown_policy():
    with pytest.raises(ValueError, match=r"debug.nan_policy='ignore' is not one of 'stop', 'skip'"):
        check_finite(1, 1.0, 1.0, "ignore")
