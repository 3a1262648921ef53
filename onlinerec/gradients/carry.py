"""The per-stream state a gradient method carries from one segment to the next: a :class:`Carry` per cell, a
:class:`StackCarry` (one carry per layer) for a :class:`~onlinerec.cells.Stack`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


class Carry:
    """State of B streams between segments. Every tensor is detached; row b belongs to stream b.

    Attributes:
        c: recurrent state c_{t} after the last processed step, shape (B, N); (B, K, N) for a cell with
            K = ``num_components`` > 1.
        window: the last ``window - 1`` inputs, flattened to (B, (window-1)*D), already zeroed where a
            reset separates them from the next step; None for cells with ``window == 1``.
        sensitivities: RTRL/SnAP only: for each tracked cell parameter (by its ``named_parameters`` name)
            dc/dtheta in the canonical layout (B, P, N, F): the parameter viewed as (P, N, F), where column
            n holds the entries that influence unit n. The input projection weight is (B, G, N, window*D),
            its bias (B, G, N, 1), a per-unit vector (B, 1, N, 1) and a (P, N) per-unit matrix (B, P, N, 1).
            With K > 1 components per unit each gains a component axis after B, dc[k]/dtheta:
            (B, K, G, N, window*D) for the input projection weight, (B, K, P, N, 1) for a per-unit parameter.

    **Lazily scaled sensitivities.** A carry made by a fully online step that was given the old carry
    (``unroll(..., donate=True)`` at M = 1, which ``OnlineRecurrentModule`` does for its training streams) holds
    its sensitivities as S~ together with a per-stream, per-unit ``scale`` a (B, N): dc/dtheta = a[b, n] * S~[b, ..., n, :].
    With K > 1 components per unit the scale is a K x K matrix per stream and unit, A (B, K, K, N):
    dc[k]/dtheta = sum_j A[b, k, j, n] * S~[b, j, ..., n, :].
    The decay of the sensitivities then costs a multiply of a, not a pass over S (docs/performance.md). Such carries
    are made on the CPU only; on a GPU the step decays S where it lies (:func:`~onlinerec.gradients.inplace.
    scales_lazily`), and a scaled carry that moves there is folded at its first step. ``sensitivities``
    always reads dc/dtheta: for a scaled carry it is computed (a new dict of new tensors at each access; write
    through :meth:`fold_` first to change the carried values in place). ``state_dict`` keeps S~ and a, so that
    resuming continues bit for bit.

    **Deferred sensitivities.** A carry returned by ``unroll(..., donate=True)`` for a segment of M > 1 steps may hold
    the old sensitivities S_0 and a pending update: backward needs S_0, so the new ones are written over it once that
    backward has read it (one sensitivity-sized tensor alive instead of two). Every read of the sensitivities
    (``sensitivities``, ``state_dict``, ``select``, ``to``, the next ``unroll``) sees the new values: read before that
    backward, they are computed out of place and the graph keeps S_0 intact.

    **Donated carries.** A carry given to ``unroll(..., donate=True)`` belongs to that call: its tensors may have
    been updated in place into the returned carry, so reading its sensitivities afterwards raises.
    """

    def __init__(
        self,
        c: Tensor,
        window: Tensor | None = None,
        sensitivities: dict[str, Tensor] | None = None,
        *,
        scale: Tensor | None = None,
        pending: Any = None,
    ) -> None:
        self.c = c
        self.window = window
        self._sensitivities: dict[str, Tensor] = {} if sensitivities is None else sensitivities
        self._scale = scale
        self._pending = pending  # a deferred update of the sensitivities (see "Deferred sensitivities")
        self._donated = False

    # -- the sensitivities -------------------------------------------------------------------------
    @property
    def sensitivities(self) -> dict[str, Tensor]:
        """dc/dtheta per tracked parameter (see the class docstring); for a lazily scaled carry a computed copy."""
        self._check_not_donated()
        self._settle()
        if self._scale is None:
            return self._sensitivities
        return {k: _unscaled(v, self._scale) for k, v in self._sensitivities.items()}

    @sensitivities.setter
    def sensitivities(self, value: dict[str, Tensor]) -> None:
        self._check_not_donated()
        self._sensitivities, self._scale, self._pending = value, None, None

    @property
    def scale(self) -> Tensor | None:
        """The per-stream, per-unit factor (B, N) of lazily scaled sensitivities ((B, K, K, N) for K > 1 components), or
        None (they are dc/dtheta)."""
        return self._scale

    def sensitivity_names(self) -> tuple[str, ...]:
        """The tracked parameters' names, without computing any sensitivity."""
        return tuple(self._sensitivities)

    def raw_sensitivities(self) -> tuple[dict[str, Tensor], Tensor | None]:
        """The stored tensors S~ and the scale a (None if unscaled), as they are: for gradient methods."""
        self._check_not_donated()
        self._settle()
        return self._sensitivities, self._scale

    def fold_(self) -> Carry:
        """Apply a lazy scale to the stored tensors in place (one pass over them), so that ``sensitivities`` is the
        live dict again; returns self."""
        self._check_not_donated()
        self._settle()
        if self._scale is not None:
            fold_scale_(self._sensitivities.values(), self._scale)
            self._scale = None
        return self

    def _settle(self) -> None:
        """Apply a pending update of the sensitivities (see "Deferred sensitivities")."""
        if self._pending is not None:
            self._sensitivities, self._pending = self._pending.materialize(), None

    def _give_up(self) -> None:
        """Mark this carry as donated to ``unroll``: its tensors now belong to the carry that call returned."""
        self._donated = True

    def _check_not_donated(self) -> None:
        if self._donated:
            raise RuntimeError(
                "this carry was given to unroll(..., donate=True): its sensitivities may have been updated in place "
                "into the carry that call returned, so they no longer describe this one. Use the returned carry (or "
                "call unroll without donate=True to keep the old carry intact)."
            )

    # -- the rest ---------------------------------------------------------------------------------------
    @property
    def batch_size(self) -> int:
        return self.c.shape[0]

    @property
    def device(self) -> torch.device:
        return self.c.device

    def state_only(self) -> Carry:
        """The state and input window without sensitivities (what a method without them, e.g. TBPTT, carries)."""
        return Carry(c=self.c, window=self.window)

    def select(self, streams: Tensor) -> Carry:
        """The carry of the streams ``streams`` (a 1-d index tensor into the batch, in that order; checked against the
        batch when it is on the CPU, where that needs no device synchronisation): new tensors, so
        an ``unroll(..., donate=True)`` may consume the result while this carry stays intact. A lazily scaled carry
        stays so (its S~ and scale are selected alike): dc/dtheta of the result is row ``streams[i]`` of this one's."""
        sens, scale = self.raw_sensitivities()
        idx = _stream_index(streams, self.batch_size, self.c.device)
        return Carry(
            c=self.c.index_select(0, idx),
            window=None if self.window is None else self.window.index_select(0, idx),
            sensitivities={k: v.index_select(0, idx) for k, v in sens.items()},
            scale=None if scale is None else scale.index_select(0, idx),
        )

    def state_dict(self) -> dict[str, Any]:
        """Plain tensors only, so checkpoints load with ``torch.load(weights_only=True)``. A lazily scaled carry adds
        ``"scale"`` and stores S~ under ``"sensitivities"`` (dc/dtheta = scale[:, None, :, None] * S~, or the K x K
        blocks of a (B, K, K, N) scale applied per unit)."""
        sens, scale = self.raw_sensitivities()
        state = {"c": self.c, "window": self.window, "sensitivities": dict(sens)}
        if scale is not None:
            state["scale"] = scale
        return state

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> Carry:
        return cls(
            c=state["c"],
            window=state.get("window"),
            sensitivities=dict(state.get("sensitivities", {})),
            scale=state.get("scale"),
        )

    def to(self, device: torch.device | str) -> Carry:
        sens, scale = self.raw_sensitivities()
        return Carry(
            c=self.c.to(device),
            window=None if self.window is None else self.window.to(device),
            sensitivities={k: v.to(device) for k, v in sens.items()},
            scale=None if scale is None else scale.to(device),
        )

    def nbytes(self) -> int:
        """Bytes held by the carried tensors (sensitivities dominate for RTRL)."""
        tensors = [self.c, *self._sensitivities.values()]
        tensors += [t for t in (self.window, self._scale) if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)

    def __repr__(self) -> str:
        shapes = {k: tuple(v.shape) for k, v in self._sensitivities.items()}
        extra = ", scaled" if self._scale is not None else ""
        extra += ", donated" if self._donated else ""
        extra += ", update pending" if self._pending is not None and not self._pending.done else ""
        window = None if self.window is None else tuple(self.window.shape)
        return f"Carry(c={tuple(self.c.shape)}, window={window}, sensitivities={shapes}{extra})"


def _stream_index(streams: Tensor, batch_size: int, device: torch.device) -> Tensor:
    """``streams`` as an int64 index on ``device``, after checking that it is 1-d and within the batch."""
    if not isinstance(streams, Tensor) or streams.dim() != 1 or streams.dtype not in (torch.int32, torch.int64):
        what = (
            f"{streams.dtype} of shape {tuple(streams.shape)}"
            if isinstance(streams, Tensor)
            else type(streams).__name__
        )
        raise TypeError(f"select takes a 1-d integer tensor of stream indices (e.g. torch.arange(0, 2)), got {what}.")
    # the range is checked where it costs nothing: indices on a GPU would have to be read back to the host
    if (
        streams.device.type == "cpu"
        and streams.numel()
        and (int(streams.min()) < 0 or int(streams.max()) >= batch_size)
    ):
        raise IndexError(
            f"stream indices must lie in [0, {batch_size}) for a carry of {batch_size} streams; got "
            f"{int(streams.min())}..{int(streams.max())}."
        )
    return streams.to(device=device, dtype=torch.int64, non_blocking=True)


def _unscaled(s: Tensor, scale: Tensor) -> Tensor:
    """dc/dtheta from lazily scaled S~ (B, P, N, F) and the scale (B, N), or S~ (B, K, P, N, F) and blocks (B, K, K, N)."""
    if scale.dim() == 4:
        return blocks_in_place_(s.clone(), scale.to(s.dtype))
    return s * scale[:, None, :, None].to(s.dtype)


def fold_scale_(tensors: Iterable[Tensor], scale: Tensor) -> None:
    """Apply a lazy scale to the stored tensors S~ in place (S~ <- dc/dtheta): a (B, N) factor, or K x K blocks
    (B, K, K, N) per unit."""
    for v in tensors:
        if scale.dim() == 4:
            blocks_in_place_(v, scale.to(v.dtype))
        else:
            v.mul_(scale[:, None, :, None].to(v.dtype))


def blocks_in_place_(s: Tensor, blocks: Tensor, groups: int = 8) -> Tensor:
    """s <- A s per stream and unit, in place: s (B, K, X, N, F), blocks A (B, K, K, N); returns s. A group of a
    ``groups``-th of the streams at a time, so that the only temporary is a copy of K - 1 components of that group (the
    components of a unit mix: the last one is updated where it lies, after the others have read it); ``groups=1``
    launches the fewest kernels."""
    b, k = blocks.shape[:2]
    group = max(1, b // groups)
    p = blocks[:, :, :, None, :, None]  # (B, K, K, 1, N, 1)
    buffer = torch.empty_like(s[:group, : k - 1])  # one buffer for every group: no fresh pages to fault in per group
    for b0 in range(0, b, group):
        rows = slice(b0, b0 + group)
        old = buffer[: s[rows].shape[0]]
        old.copy_(s[rows, : k - 1])  # components 0 .. K-2; component K-1 is still in s until the last write
        last = s[rows, k - 1]
        for i in range(k - 1):
            torch.mul(last, p[rows, i, k - 1], out=s[rows, i])
            for j in range(k - 1):
                s[rows, i].addcmul_(old[:, j], p[rows, i, j])
        last.mul_(p[rows, k - 1, k - 1])
        for j in range(k - 1):
            last.addcmul_(old[:, j], p[rows, k - 1, j])
    return s


@dataclass
class StackCarry:
    """The carry of a :class:`~onlinerec.cells.Stack`: one carry per layer, bottom first, each made by the same method.

    Same interface as :class:`Carry` (``batch_size``, ``device``, ``to``, ``state_only``, ``select``, ``state_dict`` /
    :func:`load_carry`, ``nbytes``); ``layers[l]`` is layer l's own :class:`Carry`.
    """

    layers: list[Carry | StackCarry]

    @property
    def batch_size(self) -> int:
        return self.layers[0].batch_size

    @property
    def device(self) -> torch.device:
        return self.layers[0].device

    def state_only(self) -> StackCarry:
        return StackCarry([layer.state_only() for layer in self.layers])

    def select(self, streams: Tensor) -> StackCarry:
        """Every layer's :meth:`Carry.select` of the same streams."""
        return StackCarry([layer.select(streams) for layer in self.layers])

    def state_dict(self) -> dict[str, Any]:
        """Plain tensors only: ``{"layers": [each layer's state_dict]}``."""
        return {"layers": [layer.state_dict() for layer in self.layers]}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> StackCarry:
        return cls([load_carry(layer) for layer in state["layers"]])

    def to(self, device: torch.device | str) -> StackCarry:
        return StackCarry([layer.to(device) for layer in self.layers])

    def nbytes(self) -> int:
        return sum(layer.nbytes() for layer in self.layers)


def load_carry(state: dict[str, Any]) -> Carry | StackCarry:
    """A carry from its ``state_dict``: a :class:`StackCarry` if it has ``"layers"``, else a :class:`Carry` (the layout
    of every checkpoint written before stacks existed)."""
    return StackCarry.from_state_dict(state) if "layers" in state else Carry.from_state_dict(state)
