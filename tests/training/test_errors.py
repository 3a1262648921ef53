"""Bad input gets a clear error that names the problem and the fix, before any wrong number is computed."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset
from torch.utils.data.distributed import DistributedSampler

from onlinerec import (
    RTRL,
    TBPTT,
    ELSTMCell,
    FELSTMCell,
    NotElementwiseError,
    RTRLStrategy,
    Segment,
    SnAP,
    SnAPStrategy,
    TBPTTStrategy,
)
from onlinerec.data.stream import SegmentStream
from onlinerec.training.stream_order import StreamOrderError
from tests.helpers import Regressor

M = 3


def seg(b=3, d=2, dtype=torch.float32, reset_first=True, ids=None):
    x = torch.randn(M, b, d, dtype=dtype)
    reset = torch.zeros(M, b, dtype=torch.bool)
    reset[0] = reset_first
    return Segment(x, reset, x.cumsum(0)[..., :1].float())


def fit(loader, model=None, strategy=None, steps=2, **kwargs):
    t = L.Trainer(
        strategy=strategy or RTRLStrategy(M=M),
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )
    t.fit(model or Regressor(), loader)
    return t


# -- inputs and resets -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", [RTRL(), TBPTT(), SnAP()], ids=str)
def test_wrong_input_size_dtype_and_reset_name_the_fix(method):
    cell = ELSTMCell(3, 5)
    carry = method.init_carry(cell, 2)
    ok_x, ok_r = torch.zeros(4, 2, 3), torch.zeros(4, 2, dtype=torch.bool)
    cases = [
        ((torch.zeros(4, 2, 7), ok_r), ValueError, r"D = 7 features but ELSTMCell was built with input_size = 3"),
        ((torch.zeros(4, 2, 3, dtype=torch.float64), ok_r), TypeError, r"cast one to match"),
        ((torch.zeros(4, 2, 3, dtype=torch.long), ok_r), TypeError, r"torch.int64.*cast"),
        ((torch.zeros(2, 3), ok_r), ValueError, r"time-major tensor \(M, B, D\).*Stack steps along dim 0"),
        ((ok_x, torch.zeros(4, 2)), TypeError, r"reset must be a bool tensor.*reset.bool\(\)"),
        ((ok_x, torch.zeros(4, 2, dtype=torch.long)), TypeError, r"bool"),
        (
            (ok_x, torch.zeros(4, 3, dtype=torch.bool)),
            ValueError,
            r"reset has shape \(4, 3\) but inputs need \(M, B\) = \(4, 2\)",
        ),
        ((ok_x, torch.zeros(2, dtype=torch.bool)), ValueError, r"reset has shape"),
        ((torch.zeros(0, 2, 3), torch.zeros(0, 2, dtype=torch.bool)), ValueError, r"M >= 1"),
        ((torch.zeros(4, 5, 3), torch.zeros(4, 5, dtype=torch.bool)), ValueError, r"init_carry\(cell, 5\)"),
    ]
    for (x, r), exc, match in cases:
        with pytest.raises(exc, match=match):
            method.unroll(cell, x, r, carry)


def test_segment_refuses_a_non_bool_or_misshaped_reset():
    x = torch.zeros(M, 2, 1)
    for reset in (
        torch.zeros(M, 2),
        torch.zeros(M, 3, dtype=torch.bool),
        torch.zeros(M, dtype=torch.bool),
        [[False] * 2] * M,
    ):
        with pytest.raises(
            ValueError, match=r"Segment.reset must be a bool tensor of shape \(M, B\) = \(3, 2\).*dtype=torch.bool"
        ):
            Segment(x, reset)
    with pytest.raises(ValueError, match=r"targets must start with \(M, B\)"):
        Segment(x, torch.zeros(M, 2, dtype=torch.bool), torch.zeros(M, 4))


def test_wrong_input_size_and_dtype_in_a_fit():
    with pytest.raises(ValueError, match="input_size = 2"):
        fit(DataLoader([seg(d=5)], batch_size=None))
    with pytest.raises(TypeError, match="cast"):
        fit(DataLoader([seg(dtype=torch.float64)], batch_size=None))


def test_batches_that_are_not_segments_are_refused():
    loader = DataLoader(torch.utils.data.TensorDataset(torch.zeros(8, 2), torch.zeros(8, 1)), batch_size=4)
    with pytest.raises(TypeError, match=r"trains on onlinerec Segments.*gave a list.*batch_size=None"):
        fit(loader)


def test_changing_the_number_of_streams_mid_run_is_refused():
    with pytest.raises(ValueError, match=r"from B = 3 to B = 2.*drop_last=True"):
        fit(DataLoader([seg(), seg(b=2)], batch_size=None), steps=2)


# -- segment length, method, strategy/cell ---------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [RTRLStrategy, TBPTTStrategy, SnAPStrategy])
@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "4", None])
def test_segment_length_below_one_or_not_an_int_is_refused(cls, bad):
    with pytest.raises(
        ValueError, match=r"M \(steps between weight updates\) must be an int >= 1.*M = 1 is fully online"
    ):
        cls(M=bad)


def test_unknown_method_names_the_choices():
    with pytest.raises(ValueError, match=r"unknown gradient method 'rtlr'.*'rtrl', 'snap', 'tbptt'"):
        Regressor(method="rtlr")
    with pytest.raises(TypeError, match="GradientMethod"):
        Regressor(method=42)
    with pytest.raises(TypeError, match=r"RTRLStrategy got unexpected keyword argument\(s\) \['carry'\]"):
        RTRLStrategy(M=2, carry="fast")
    with pytest.raises(ValueError, match="only n = 1"):
        SnAPStrategy(M=2, n=2)


def test_strategy_cell_mismatch_names_the_cell_and_the_alternatives():
    with pytest.raises(NotElementwiseError, match=r"FELSTMCell is fully recurrent.*SnAPStrategy.*TBPTTStrategy"):
        fit(DataLoader([seg()], batch_size=None), model=Regressor(FELSTMCell(2, 4)))
    with pytest.raises(TypeError, match="ElementwiseCell"):
        Regressor(torch.nn.LSTMCell(2, 4))


def test_module_outside_a_trainer_says_how_to_pick_a_method():
    with pytest.raises(RuntimeError, match=r"outside a Trainer.*RTRLStrategy\(M=...\).*method='rtrl'"):
        Regressor()(seg().inputs, seg().reset)


# -- data that shuffles or interleaves streams ------------------------------------------------------------------------
def test_a_shuffling_dataloader_is_refused():
    segments = [seg(reset_first=i == 0) for i in range(6)]
    with pytest.raises(
        StreamOrderError, match=r"random order \(RandomSampler, e.g. from shuffle=True\).*carries each stream's state"
    ):
        fit(DataLoader(segments, batch_size=None, shuffle=True))
    t = fit(DataLoader(segments, batch_size=None, shuffle=False))  # the same data in order is fine
    # and Lightning put no (shuffling) DistributedSampler into it, although the onlinerec strategies are DDPStrategies
    assert type(t.train_dataloader.sampler).__name__ == "SequentialSampler"


def test_a_sampler_that_deals_batches_across_ranks_is_refused():
    segments = [seg() for _ in range(6)]
    sampler = DistributedSampler(segments, num_replicas=2, rank=0, shuffle=False)
    with pytest.raises(StreamOrderError, match=r"every 2-th batch to each rank.*use_distributed_sampler=False"):
        fit(DataLoader(segments, batch_size=None, sampler=sampler))


class _Segments(IterableDataset):
    def __iter__(self):
        for i in range(6):
            yield seg(reset_first=i == 0)


def test_an_iterable_dataset_read_by_several_workers_is_refused():
    with pytest.raises(StreamOrderError, match=r"num_workers=2.*interleaved.*num_workers=0"):
        fit(DataLoader(_Segments(), batch_size=None, num_workers=2))


def test_sequence_segments_whose_streams_are_reordered_are_refused():
    """Continuity check: a slot that is not reset must keep the sequence (sequence_id) it held."""
    sequences = pytest.importorskip("onlinerec.data.sequences")

    def make(ids_rows, reset_first):
        x = torch.randn(M, 2, 2)
        reset = torch.zeros(M, 2, dtype=torch.bool)
        reset[0] = reset_first
        ids = torch.tensor(ids_rows).expand(M, 2).clone()
        return sequences.SequenceSegment(x, reset, x.cumsum(0)[..., :1], sequence_id=ids)

    in_order = [make([0, 1], True), make([0, 1], False), make([2, 1], torch.tensor([True, False]))]
    fit(DataLoader(in_order, batch_size=None), steps=3)
    swapped = [make([0, 1], True), make([1, 0], False)]  # the two streams swapped slots
    with pytest.raises(
        StreamOrderError, match=r"stream slot 0 held sequence 0 .* continues with sequence 1 without a reset"
    ):
        fit(DataLoader(swapped, batch_size=None), steps=2)


def test_segment_stream_passes_the_order_check():
    fit(SegmentStream(lambda epoch: (seg(reset_first=i == 0) for i in range(4))), steps=4)


# -- RL ---------------------------------------------------------------------------------------------------------------


def test_num_actions_not_matching_the_env_is_refused():
    rl = pytest.importorskip("onlinerec.rl")
    model = rl.R2AC(5, (4,), cell="elstm", hidden_size=8, stem="mlp", fc_size=8)  # memory:tmaze has 2 actions
    with pytest.raises(ValueError, match=r"acts in Discrete\(5\).*action space Discrete\(2\).*spaces\(\)"):
        fit(
            rl.RolloutDataModule("memory:tmaze", num_envs=2, env_kwargs=dict(length=3)),
            model=model,
            strategy=RTRLStrategy(M=M),
        )


def test_segments_whose_length_is_not_M_are_refused():
    """7-step segments under RTRLStrategy(M=4) used to train without a word."""
    seven = [Segment(torch.randn(7, 3, 2), torch.zeros(7, 3, dtype=torch.bool), torch.zeros(7, 3, 1))] * 3
    with pytest.raises(ValueError, match=r"segment of 7 steps, but the strategy's M is 4.*trainer.strategy.M.*M=7"):
        fit(DataLoader(seven, batch_size=None), strategy=RTRLStrategy(M=4))


def test_a_dataloader_that_would_rebatch_segments_names_the_fix():
    with pytest.raises(TypeError, match=r"DataLoader batches Segments \(batch_size=1\).*batch_size=None"):
        fit(DataLoader([seg(), seg()]))


def test_data_modules_refuse_a_segment_length_below_one():
    from onlinerec.data import DelayedRecallDataModule

    with pytest.raises(ValueError, match=r"M \(steps between weight updates\) must be an int >= 1, got 0"):
        DelayedRecallDataModule(M=0)
    with pytest.raises(ValueError, match="num_streams must be an int >= 1"):
        DelayedRecallDataModule(num_streams=0)
