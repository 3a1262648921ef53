"""The cell contract: one dense input projection, then a recurrence that is element-wise per hidden unit.

A cell is a pure single step. Time loops, resets and carried state live in :mod:`onlinerec.gradients`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch
from torch import Tensor, nn


class ElementwiseCell(nn.Module, ABC):
    """Base class of every onlinerec cell.

    A step computes ``gates = input_proj(u_t)`` with ``u_t`` the last ``window`` inputs concatenated
    (``u_t = x_t`` for ``window = 1``), then ``c_t = recurrence(gates, c_{t-1})`` and finally the
    feed-forward output ``h_t = readout(c_t, x_t)``.

    Subclasses set the class attribute :attr:`num_gates`, call ``super().__init__(input_size, hidden_size)``,
    create their per-unit parameters (shape ``(N,)`` or ``(K, N)``) and implement :meth:`recurrence`
    with element-wise operations only. They never write a derivative: the gradient methods obtain
    every derivative RTRL needs from :meth:`recurrence` by automatic differentiation.
    """

    num_gates: ClassVar[int] = 1
    """G: how many gate pre-activations per hidden unit the input projection produces."""
    window: ClassVar[int] = 1
    """How many consecutive inputs the projection reads (QRNN's width-2 filter: 2). Earlier inputs are
    feed-forward state, carried across segments but never differentiated through time."""

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        for name, value in (("input_size", input_size), ("hidden_size", hidden_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{type(self).__name__}: {name} must be a positive int, got {value!r}.")
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.input_proj = nn.Linear(self.window * input_size, self.num_gates * hidden_size)

    @property
    def output_size(self) -> int:
        """Width of :meth:`readout`'s output (N unless a subclass says otherwise)."""
        return self.hidden_size

    @abstractmethod
    def recurrence(self, gates: Tensor, c_prev: Tensor) -> Tensor:
        """One step of the state: gates (..., G, N) and c_prev (..., N) -> c (..., N).

        Must be element-wise: unit n of the result may read only ``gates[..., :, n]``, ``c_prev[..., n]``
        and column n of per-unit parameters. Leading dimensions are independent rows.
        """

    def readout(self, c: Tensor, x: Tensor) -> Tensor:
        """Feed-forward output from the new state c (..., N) and the step's input x (..., D).

        Not differentiated through time; the default returns c. Works on any leading dimensions, so
        the framework applies it to a whole segment (M, B, ...) at once.
        """
        return c

    def forward(self, u: Tensor, c_prev: Tensor) -> Tensor:
        """One pure step: window features u (B, window*D) and c_prev (B, N) -> c (B, N)."""
        gates = self.input_proj(u).unflatten(-1, (self.num_gates, self.hidden_size))
        return self.recurrence(gates, c_prev)

    def extra_repr(self) -> str:
        return f"input_size={self.input_size}, hidden_size={self.hidden_size}"


class FullyRecurrentCell(ElementwiseCell):
    """A cell whose gates also read the whole previous state through a dense matrix R.

    ``recurrence(gates, c_prev) = pointwise(gates + R c_prev, c_prev)`` with ``R = recurrent_proj``
    (``nn.Linear(N, G*N, bias=False)``). The Jacobian dc_t/dc_{t-1} is dense, so exact RTRL would cost
    O(N^4) per step and :class:`~onlinerec.gradients.RTRL` refuses such cells; SnAP-1 and TBPTT train them.
    Subclasses implement :meth:`pointwise`, which must be element-wise.
    """

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__(input_size, hidden_size)
        self.recurrent_proj = nn.Linear(hidden_size, self.num_gates * hidden_size, bias=False)

    @abstractmethod
    def pointwise(self, pre_gates: Tensor, c_prev: Tensor) -> Tensor:
        """Element-wise part: full pre-activations (..., G, N) and c_prev (..., N) -> c (..., N)."""

    def recurrence(self, gates: Tensor, c_prev: Tensor) -> Tensor:
        mixed = self.recurrent_proj(c_prev).unflatten(-1, (self.num_gates, self.hidden_size))
        return self.pointwise(gates + mixed, c_prev)


def normal_(tensor: Tensor, std: float) -> Tensor:
    """In-place N(0, std^2) init without autograd (the paper's eLSTM init uses std 0.1)."""
    with torch.no_grad():
        return tensor.normal_(0.0, std)
