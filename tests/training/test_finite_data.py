"""A NaN or inf in the data (not in the training) stops training with a message that names the tensor, how many
entries and where the first one is, and does not advise a lower learning rate."""

from __future__ import annotations

import pytest
import torch

from onlinerec import RTRLStrategy, Segment
from onlinerec.data.stream import SegmentStream
from onlinerec.training.callbacks import NonFiniteError
from tests.helpers import Regressor, quiet_trainer

M = 4


def segments_with(field: str, step: int = 2, stream: int = 1, segment: int = 3):
    def make(epoch: int):
        gen = torch.Generator().manual_seed(epoch)
        for i in range(8):
            x = torch.randn(M, 3, 2, generator=gen)
            y = x.cumsum(0)[..., :1]
            if i == segment:
                if field == "inputs":
                    x[step, stream, 1] = float("nan")
                    x[step + 1, 0, 0] = float("inf")
                else:
                    y[step, stream, 0] = float("nan")
            reset = torch.zeros(M, 3, dtype=torch.bool)
            reset[0] |= i == 0
            yield Segment(x, reset, y)

    return SegmentStream(make)


def test_nan_in_the_inputs_is_named_and_the_learning_rate_is_not_blamed():
    torch.manual_seed(0)
    with pytest.raises(NonFiniteError) as info:
        quiet_trainer(RTRLStrategy(M=M), max_steps=8).fit(Regressor(), segments_with("inputs"))
    message = str(info.value)
    assert "global step 3" in message
    assert (
        "segment.inputs holds 2 non-finite (NaN, inf) of 24 entries, the first at step 2, stream 1, feature 1"
        in message
    )
    assert "learning rate" not in message and "torch.nan_to_num" in message


def test_nan_in_the_targets_is_named():
    torch.manual_seed(0)
    with pytest.raises(NonFiniteError) as info:
        quiet_trainer(RTRLStrategy(M=M), max_steps=8).fit(Regressor(), segments_with("targets", step=1, stream=2))
    message = str(info.value)
    assert "segment.targets holds 1 non-finite (NaN) of 12 entries, the first at step 1, stream 2" in message
    assert "segment.inputs" not in message and "learning rate" not in message


def test_a_loss_that_diverges_on_finite_data_still_gets_the_training_advice():
    class Diverging(Regressor):
        def segment_loss(self, outputs, segment):
            loss = super().segment_loss(outputs, segment)
            return loss * float("nan") if self.global_step == 2 else loss

    torch.manual_seed(0)
    with pytest.raises(NonFiniteError) as info:
        quiet_trainer(RTRLStrategy(M=M), max_steps=8).fit(Diverging(), segments_with("none"))
    assert "Lower the learning rate" in str(info.value) and "not finite:" not in str(info.value)
