"""Faults: NaN/inf stops training at the step that produced it (the last good checkpoint stays), and the guard that
stops it is added once and can be turned off. (Env workers that crash, die or hang: tests/rl/envs/test_resilient.py.)"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from onlinerec import RTRLStrategy, Segment
from onlinerec.data.stream import SegmentStream
from onlinerec.training.callbacks import FiniteGuard, NonFiniteError
from tests.helpers import Regressor

M = 4


def segments(epoch: int):
    gen = torch.Generator().manual_seed(epoch)
    for i in range(20):
        x = torch.randn(M, 3, 2, generator=gen)
        reset = torch.zeros(M, 3, dtype=torch.bool)
        reset[0] |= i == 0
        yield Segment(x, reset, x.cumsum(0)[..., :1])


class FaultyRegressor(Regressor):
    """The boring model, made to produce a NaN/inf loss or a NaN gradient at ``bad_step``."""

    def __init__(self, bad_step: int | None = None, kind: str = "nan") -> None:
        super().__init__()
        self.bad_step, self.kind = bad_step, kind

    def segment_loss(self, outputs, segment):
        loss = super().segment_loss(outputs, segment)
        if self.global_step == self.bad_step:
            if self.kind == "nan":
                loss = loss * float("nan")
            elif self.kind == "inf":
                loss = loss + float("inf")
            elif self.kind == "grad":  # finite loss, NaN gradient: d sqrt(x)/dx at 0 is inf, times 0
                loss = loss + torch.sqrt(self.head.bias * 0).sum()
        return loss


def fit(model, tmp_path: Path | None = None, max_steps: int = 8, callbacks=(), ckpt_path=None):
    cbs = list(callbacks)
    if tmp_path is not None:
        cbs.append(ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1))
    trainer = L.Trainer(
        strategy=RTRLStrategy(M=M),
        accelerator="cpu",
        devices=1,
        max_steps=max_steps,
        logger=False,
        enable_checkpointing=tmp_path is not None,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=cbs,
    )
    trainer.fit(model, SegmentStream(segments), ckpt_path=ckpt_path)
    return trainer


# -- NaN / inf ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["nan", "inf"])
def test_nan_loss_stops_training_naming_the_step_and_the_last_checkpoint_stays(tmp_path, kind):
    torch.manual_seed(0)
    model = FaultyRegressor(bad_step=5, kind=kind)
    with pytest.raises(NonFiniteError, match=r"global step 5 .*the loss is (nan|inf).*epoch=0-step=5\.ckpt") as info:
        fit(model, tmp_path)
    assert "gradient_clip_val" in str(info.value)  # and says what to do
    names = sorted(p.name for p in tmp_path.glob("*.ckpt"))
    assert names[-1] == "epoch=0-step=5.ckpt" and len(names) == 5  # nothing written at or after the bad step
    last = torch.load(tmp_path / names[-1], weights_only=True)
    for name, value in model.state_dict().items():  # the bad update was never applied
        assert torch.isfinite(value).all(), name
        torch.testing.assert_close(last["state_dict"][name], value, rtol=0, atol=0)

    resumed = FaultyRegressor()  # and the last checkpoint resumes
    trainer = fit(resumed, max_steps=7, ckpt_path=tmp_path / names[-1])
    assert trainer.global_step == 7 and all(torch.isfinite(p).all() for p in resumed.parameters())


def test_nan_gradient_with_a_finite_loss_is_caught_and_named():
    torch.manual_seed(0)
    with pytest.raises(NonFiniteError, match=r"global step 3 .*gradients of .*head\.bias.* are not finite") as info:
        fit(FaultyRegressor(bad_step=3, kind="grad"))
    assert "the loss is" not in str(info.value)


def test_nan_guard_is_added_once_and_can_be_turned_off():
    torch.manual_seed(0)
    model = FaultyRegressor(bad_step=2)
    trainer = fit(model, max_steps=4, callbacks=[FiniteGuard(enabled=False)])
    assert sum(isinstance(cb, FiniteGuard) for cb in trainer.callbacks) == 1  # the module did not add another
    assert not all(torch.isfinite(p).all() for p in model.parameters())  # unguarded, the NaN step ruined the weights

    trainer = fit(FaultyRegressor(), max_steps=1)
    assert sum(isinstance(cb, FiniteGuard) for cb in trainer.callbacks) == 1  # added by default
