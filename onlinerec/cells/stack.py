"""Stacked layers: layer l+1 reads layer l's output at the same step; each layer keeps its own carried state."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import Tensor, nn

from onlinerec.cells.base import ElementwiseCell
from onlinerec.cells.composite import CompositeCell

_NORMS: dict[str, Callable[[int], nn.Module]] = {"layer": nn.LayerNorm, "rms": nn.RMSNorm}


class Stack(CompositeCell):
    """A deep recurrent model: cells stacked so that layer l+1 reads the output (readout) of layer l at the same step.

    Per step t and layer l = 1..L, from the stack's input u^1_t = x_t::

        v^l_t = norm_l(u^l_t)                       (if ``norm``; else v = u)
        c^l_t = layer_l.recurrence(layer_l.input_proj(v^l_t ...), c^l_{t-1})
        h^l_t = layer_l.readout(c^l_t, v^l_t)
        u^{l+1}_t = h^l_t + u^l_t                   (a residual connection, if ``residual`` and the widths match)
                  = h^l_t                           (otherwise)

    and the stack's output is u^{L+1}_t. With ``residual=True`` and ``norm="layer"`` each layer is the pre-norm
    residual block of the LRU paper (Orvieto et al. 2023), without its feed-forward part.

    Every gradient method (RTRL, SnAP, TBPTT) unrolls a stack layer by layer over the segment, each layer with its
    own carry (a :class:`~onlinerec.gradients.carry.StackCarry`): within a segment the gradient is exact backprop
    through all layers and steps; across segment boundaries each layer's parameters get that layer's method gradient
    and the terms that cross both a segment boundary and a layer boundary are dropped (Zucchet et al. 2023;
    docs/concepts.md#stacked-layers states the approximation precisely).

    What a method's ``unroll`` returns for a stack is already the stack's output (M, B, output_size) (every layer's
    readout is applied inside the unroll), so :meth:`readout` is the identity and ``module.forward`` works unchanged.

    Args:
        cells: the layers, bottom first; ``cells[l+1].input_size`` must equal ``cells[l].output_size``.
        residual: add each layer's input to its output, for every layer whose input and output widths are equal
            (:attr:`residual_layers` lists them; at least one must qualify).
        norm: None, "layer" (LayerNorm) or "rms" (RMSNorm), applied to every layer's input.
    """

    parts_name = "layers"

    def __init__(self, cells: Sequence[ElementwiseCell], residual: bool = False, norm: str | None = None) -> None:
        cells = self._init_parts(cells, "layer")
        for i, (below, above) in enumerate(zip(cells, cells[1:])):
            if above.input_size != below.output_size:
                raise ValueError(
                    f"Stack layer {i + 1} ({type(above).__name__}) reads {above.input_size} features but layer {i} "
                    f"({type(below).__name__}) outputs {below.output_size}: build layer {i + 1} with "
                    f"input_size={below.output_size}."
                )
        if norm is not None and norm not in _NORMS:
            raise ValueError(f"Stack: norm must be None or one of {sorted(_NORMS)}, got {norm!r}.")
        self.layers = nn.ModuleList(cells)
        self.input_size = cells[0].input_size
        self.hidden_size = cells[-1].hidden_size
        self.residual = bool(residual)
        self.norm = norm
        self.norms = None if norm is None else nn.ModuleList([_NORMS[norm](c.input_size) for c in cells])
        self.residual_layers = tuple(i for i, c in enumerate(cells) if self.residual and c.input_size == c.output_size)
        if self.residual and not self.residual_layers:
            raise ValueError(
                "Stack(residual=True): no layer has equal input and output widths, so none can take a residual."
            )

    @property
    def output_size(self) -> int:
        return self.layers[-1].output_size

    def layer_input(self, layer: int, u: Tensor) -> Tensor:
        """What layer ``layer`` reads, from the stack's stream at its level u (..., width): norm(u) or u."""
        return u if self.norms is None else self.norms[layer](u)

    def layer_output(self, layer: int, u: Tensor, h: Tensor) -> Tensor:
        """The stream above layer ``layer``, from its input u and its readout h: h + u (residual) or h."""
        return h + u if layer in self.residual_layers else h

    def unroll_layers(
        self, unroll_layer: Callable[[ElementwiseCell, Tensor, Any], tuple[Tensor, Any]], inputs: Tensor, carries: list
    ) -> tuple[Tensor, list]:
        """Run the layers one after the other over a whole segment: ``unroll_layer(cell, inputs, carry) -> (states,
        carry)`` unrolls one layer (a gradient method's unroll); returns the stack's outputs and the new carries."""
        u, new = inputs, []
        for i, (cell, carry) in enumerate(zip(self.layers, carries)):
            v = self.layer_input(i, u)
            states, carry = unroll_layer(cell, v, carry)
            u = self.layer_output(i, u, cell.readout(states, v))
            new.append(carry)
        return u, new

    def extra_repr(self) -> str:
        return f"residual={self.residual}, norm={self.norm!r}"
