"""Supervised streams: every sequence exactly once per epoch, whole and in order, resets at starts, any M."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from onlinerec.data import IGNORE_INDEX, SequenceDataModule, SequenceSegment, TensorSequences
from onlinerec.data.sequences import SequenceStream, count_segments, deal


def make_sequences(lengths, feature_dim=None, seed=0):
    """Sequence i holds the values 1000*i + t (unique everywhere), as inputs (L,) or (L, D), targets (L,)."""
    out = []
    for i, n in enumerate(lengths):
        t = torch.arange(n) + 1000 * i
        x = t if feature_dim is None else t[:, None].repeat(1, feature_dim).float()
        out.append((x, t % 7))
    return TensorSequences(out)


def replay(segments):
    """Per slot, the list of (sequence id, step values) as they stream by; also checks per-segment invariants."""
    slots: dict[int, list] = {}
    for seg in segments:
        m, b = seg.reset.shape
        for slot in range(b):
            for t in range(m):
                sid = int(seg.sequence_id[t, slot])
                if sid < 0:  # padding: flagged as a reset, ignored target
                    assert bool(seg.reset[t, slot])
                    assert int(seg.targets[t, slot]) == IGNORE_INDEX
                    slots.setdefault(slot, []).append(("pad", None, None))
                    continue
                slots.setdefault(slot, []).append((sid, seg.inputs[t, slot], bool(seg.reset[t, slot])))
    return slots


@pytest.mark.parametrize(
    ("lengths", "streams", "m"),
    [
        ([5, 3, 7, 2, 4, 9, 1, 6], 3, 4),  # M divides nothing in particular
        ([5, 3, 7, 2, 4, 9, 1, 6], 3, 1),  # M = 1: fully online
        ([10, 10, 10, 10], 2, 3),  # M does not divide the lengths
        ([4], 3, 2),  # fewer sequences than streams
        ([2, 13, 1, 1, 1, 8, 3], 2, 5),
    ],
)
def test_every_sequence_once_whole_in_order_with_resets_at_starts(lengths, streams, m):
    data = make_sequences(lengths)
    segments = list(deal(data, streams, m))
    assert all(s.inputs.shape[:2] == (m, streams) and s.reset.shape == (m, streams) for s in segments)
    assert len(segments) == count_segments(lengths, streams, m) == len(SequenceStream(data, streams, m))

    seen: dict[int, list] = {}
    starts: dict[int, tuple[int, int]] = {}  # sequence -> (global time, slot)
    for slot, steps in replay(segments).items():
        padding_started = False
        prev = None
        for time, (sid, value, reset) in enumerate(steps):
            if sid == "pad":
                padding_started = True
                continue
            assert not padding_started, "padding only at the end of a stream"
            if sid != prev:
                assert reset, f"sequence {sid} must start with reset=True"
                assert sid not in seen, f"sequence {sid} appears twice"
                starts[sid] = (time, slot)
                seen[sid] = []
            else:
                assert not reset, "no reset inside a sequence"
            seen[sid].append(int(value))
            prev = sid
    assert sorted(seen) == list(range(len(lengths))), "every sequence exactly once"
    for sid, values in seen.items():
        assert values == (torch.arange(lengths[sid]) + 1000 * sid).tolist(), "whole and in order"
    start_times = [starts[i][0] for i in range(len(lengths))]
    assert start_times == sorted(start_times), "sequences start in index order"


def test_equal_lengths_deal_round_robin_and_first_sequences_fill_slots():
    data = make_sequences([6] * 7)
    segments = list(deal(data, 3, 4))
    first_slot = {}
    for seg in segments:
        for t, slot in (seg.reset & (seg.sequence_id >= 0)).nonzero().tolist():
            first_slot[int(seg.sequence_id[t, slot])] = slot
    assert first_slot == {i: i % 3 for i in range(7)}


def test_padding_convention_and_feature_inputs():
    data = make_sequences([3, 8], feature_dim=2)
    segs = list(deal(data, 2, 5, pad_value=-1.0))
    assert isinstance(segs[0], SequenceSegment)
    last = segs[-1]
    assert last.inputs.shape == (5, 2, 2)
    pad = ~last.mask
    assert pad.any()
    assert (last.inputs[pad] == -1).all() and (last.targets[pad] == IGNORE_INDEX).all() and last.reset[pad].all()
    assert (last.sequence_id[pad] == -1).all()


def test_padding_of_float_targets():
    data = TensorSequences([(torch.ones(3, 2), torch.ones(3, 4)), (torch.ones(1, 2), torch.ones(1, 4))])
    (seg,) = deal(data, 2, 3)
    assert seg.targets.dtype == torch.float32 and (seg.targets[1:, 1] == 0).all() and not seg.mask[1:, 1].any()


def test_bad_sequences_are_refused():
    with pytest.raises(ValueError, match="empty"):
        list(deal(TensorSequences([(torch.zeros(0), torch.zeros(0))]), 1, 2))
    with pytest.raises(ValueError, match="same length"):
        list(deal(TensorSequences([(torch.zeros(3), torch.zeros(2))]), 1, 2))
    with pytest.raises(ValueError, match="M"):
        list(deal(make_sequences([2]), 1, 0))


def test_ranks_share_out_the_sequences():
    data = make_sequences([3, 1, 4, 1, 5, 9, 2])
    ids = []
    for rank in range(3):
        for seg in SequenceStream(data, 2, 3, rank=rank, world_size=3):
            ids.extend(seg.sequence_id[seg.reset & seg.mask].tolist())
    assert sorted(ids) == list(range(7))


def test_stream_resumes_with_the_next_segment():
    data = make_sequences([5, 3, 7, 2, 4])
    full = [s.sequence_id for s in SequenceStream(data, 2, 2)]
    stream = SequenceStream(data, 2, 2)
    it = iter(stream)
    for _ in range(3):
        next(it)
    state = stream.state_dict()
    done = state["consumed"]
    assert done in (2, 3)  # 2 if the stream counts Lightning's one-batch look-ahead as not yet consumed
    resumed = SequenceStream(data, 2, 2)
    resumed.load_state_dict(state)
    rest = [s.sequence_id for s in resumed]
    assert len(rest) == len(full) - done and all(torch.equal(a, b) for a, b in zip(full[done:], rest))


def test_datamodule_reads_M_from_the_trainer_strategy_or_an_override():
    data = make_sequences([4, 6, 5])
    dm = SequenceDataModule(train=data, val=data, num_streams=2)
    with pytest.raises(RuntimeError, match="M="):
        dm.train_dataloader()
    dm.trainer = SimpleNamespace(strategy=SimpleNamespace(M=3), global_rank=0, world_size=1)
    assert next(iter(dm.train_dataloader())).reset.shape == (3, 2)
    assert dm.val_dataloader().segment_length == 3
    explicit = SequenceDataModule(train=data, val=data, test=data, num_streams=2, eval_streams=3, M=2, eval_M=7)
    assert next(iter(explicit.train_dataloader())).reset.shape == (2, 2)
    assert next(iter(explicit.test_dataloader())).reset.shape == (7, 3)
    assert SequenceDataModule(val=data).val_dataloader().segment_length == 64  # evaluation without any M
    with pytest.raises(RuntimeError, match="no train"):
        SequenceDataModule(M=2).train_dataloader()


def test_training_resumed_mid_epoch_matches_an_uninterrupted_run(tmp_path):
    import lightning as L

    from onlinerec import RTRLStrategy
    from onlinerec.data import DelayedRecallDataModule
    from onlinerec.tasks import SequenceClassifier

    def trainer(steps):
        return L.Trainer(
            strategy=RTRLStrategy(M=3),
            max_steps=steps,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            limit_val_batches=0,
            num_sanity_val_steps=0,
        )

    def fresh():
        L.seed_everything(0, verbose=False)
        data = DelayedRecallDataModule(delay=5, num_symbols=3, train_size=40, val_size=4, num_streams=4)
        return SequenceClassifier(7, 3, hidden_size=5, lr=1e-2), data

    model, data = fresh()
    trainer(7).fit(model, data)
    first, data1 = fresh()
    t1 = trainer(3)
    t1.fit(first, data1)
    t1.save_checkpoint(tmp_path / "mid.ckpt")
    resumed, data2 = fresh()
    trainer(7).fit(resumed, data2, ckpt_path=tmp_path / "mid.ckpt")
    for (name, a), b in zip(model.named_parameters(), resumed.parameters()):
        assert torch.allclose(a, b, atol=1e-6), name
