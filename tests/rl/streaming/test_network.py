"""The streaming agent's networks: stream-x's sparse initialisation and the layout around the core."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from onlinerec.cells import make_cell
from onlinerec.rl.streaming.network import StreamNet, sparse_init_


@pytest.mark.parametrize("sparsity", [0.0, 0.5, 0.9])
def test_sparse_init_zeroes_that_share_of_each_units_inputs(sparsity):
    torch.manual_seed(0)
    w = sparse_init_(torch.empty(16, 40), sparsity)
    zeros = (w == 0).sum(1)
    assert torch.all(zeros == min(39, int(torch.tensor(sparsity * 40).ceil())))
    assert float(w.abs().max()) <= (1 / 40) ** 0.5


def test_every_input_is_kept_for_at_least_one_weight_per_unit():
    w = sparse_init_(torch.empty(5, 3), 1.0)
    assert torch.all((w != 0).sum(1) == 1)


def test_the_core_reads_the_observation_and_the_dense_layers_are_sparse():
    torch.manual_seed(0)
    core = make_cell("rtu", 6, 8)
    net = StreamNet(6, 16, core, nn.Linear(16, 3), sparsity=0.9)
    assert net.encoder is None and net.hidden.in_features == core.output_size
    assert float((net.hidden.weight == 0).float().mean()) >= 0.9
    assert torch.count_nonzero(net.hidden.bias) == 0
    ff = StreamNet(6, 16, None, nn.Linear(16, 3), sparsity=0.9)
    assert ff.encoder.in_features == 6 and ff.hidden.in_features == 16
