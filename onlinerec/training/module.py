"""OnlineRecurrentModule: a LightningModule that unrolls a cell over segments with the trainer's method."""

from __future__ import annotations

import os
import warnings
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins.precision import DoublePrecision
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from typing_extensions import override

from onlinerec.cells import build_cell_spec, cell_reference
from onlinerec.cells.base import ElementwiseCell
from onlinerec.data.segment import Segment
from onlinerec.gradients import METHODS, TBPTT, Carry, GradientMethod
from onlinerec.gradients.carry import StackCarry, load_carry
from onlinerec.training.callbacks import FiniteGuard
from onlinerec.training.checkpoint import CARRY_KEY, peek_checkpoint, verify_checkpoint_file
from onlinerec.training.stream_order import ContinuityCheck, check_batching, check_ranks_differ, check_stream_order

__all__ = ["OnlineRecurrentModule"]

# Every OnlineRecurrentModule defines validation_step (the template step serves all splits), so Lightning's reminder
# that a fit without a val_dataloader skips validation is noise for them, not something a user should act on.
warnings.filterwarnings("ignore", message=r".*defined a `validation_step` but have no `val_dataloader`.*")
# Lightning 2.6 calls a pytree API that torch 2.13 deprecates: Lightning's to fix, nothing a user can act on.
warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated.*")
# Manual optimisation makes Lightning warn that a step checkpoint holds the weights after that step's update. That is
# what resuming needs: the carry saved with them is the one after the same update (resume is tested to continue exactly).
warnings.filterwarnings("ignore", message=r".*Using ModelCheckpoint with manual optimization and every_n_train_steps.*")
# A cell among a module's hyper-parameters is stored as its cell_spec (on_save_checkpoint), not pickled with the weights:
# keeping it there is what lets load_from_checkpoint rebuild it, so Lightning's advice to leave it out does not apply.
warnings.filterwarnings("ignore", message=r"Attribute 'cell' is an instance of `nn.Module` and is already saved.*")


class OnlineRecurrentModule(L.LightningModule):
    """Trains a recurrent cell online: each training batch is a :class:`Segment` of M steps from B streams.

    The module carries each stream's state (and, for RTRL/SnAP, its sensitivities) from one batch to the
    next, zeroes it where ``segment.reset`` is set, and stores it in checkpoints so that training resumes
    exactly. The gradient method comes from the trainer's strategy (``RTRLStrategy``, ``TBPTTStrategy``,
    ``SnAPStrategy``); pass ``method=`` to use the module outside a Trainer.

    A subclass writes :meth:`segment_loss` (and any heads and metrics it needs); :meth:`encode` may map raw inputs
    to the cell's inputs (an embedding, a vision stem). Every split runs the one template step
    :meth:`shared_step`: check the batch, ``outputs = self(inputs, reset, stream)``, ``segment_loss``, log.
    Everything below the cell gets within-segment backprop.

    Args:
        cell: the recurrent cell, or None for a feed-forward baseline (outputs = ``encode(inputs)``; no carried state).
        lr: learning rate of the default Adam optimizer (override :meth:`configure_optimizers` for others).
        method: a gradient method, its registered name ("rtrl", "tbptt", "snap") or class path; None takes the
            trainer strategy's.
    """

    loss_reduction: str = "mean"
    """How :meth:`segment_loss` reduces over streams: "mean" (the default) or "sum". Under DDP a summed loss is
    multiplied by the number of processes W before backward, so that W processes with B streams each take the
    gradient of one process with all W * B streams (DDP averages gradients); a mean needs nothing."""

    def __init__(
        self, cell: ElementwiseCell | None, lr: float = 1e-3, method: GradientMethod | str | None = None
    ) -> None:
        super().__init__()
        if cell is not None and not isinstance(cell, ElementwiseCell):
            raise TypeError(
                f"cell must be an onlinerec ElementwiseCell (or None for a feed-forward model), got {type(cell).__name__}."
            )
        self.cell = cell
        self.lr = lr
        self._method: GradientMethod | None = None if method is None else METHODS.build(method)
        self._carries: dict[str, Carry] = {}  # a plain dict, not buffers: DDP must not broadcast rank 0's streams
        self._continuity = ContinuityCheck()  # SequenceSegments: a slot keeps its sequence unless reset
        self._checked_loaders: int | None = None  # id of the training loader(s) check_stream_order last passed
        self._current_stream: str | None = None
        self._ranks_checked = False  # once per fit: DDP ranks must not all train on the same streams
        self._order_checked = False  # the training batch's stream order was checked on the host, before its transfer

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        """``.to()``, ``.cuda()``, ``.cpu()``: the carried states (not buffers: each rank keeps its own) follow the
        cell's parameters (a feed-forward model's) to their device. Their dtype stays (the sensitivities may be kept
        wider than the weights)."""
        out = super()._apply(fn, recurse)
        carries = self.__dict__.get("_carries")
        cell = self.__dict__.get("_modules", {}).get("cell")
        param = next((cell if cell is not None else self).parameters(), None)
        if carries and param is not None:
            self._carries = {k: v if v.device == param.device else v.to(param.device) for k, v in carries.items()}
        return out

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        """Lightning's ``load_from_checkpoint``, after checking the file (:func:`~onlinerec.training.checkpoint.
        verify_checkpoint_file`: a damaged file is named, not half-loaded) and weights-only unless asked otherwise.

        Keyword arguments replace the saved hyper-parameters, so ``load_from_checkpoint(path, cell=MyCell(...))``
        gives the model a cell built here (its weights still come from the checkpoint): the way to load a cell class
        that the saving process defined in its ``__main__``. A cell that a subclass passed to
        ``save_hyperparameters()`` is stored as its :func:`~onlinerec.cells.cell_spec` and rebuilt here."""
        if isinstance(checkpoint_path, (str, os.PathLike)):
            verify_checkpoint_file(checkpoint_path)
            kwargs.update(_saved_cells(checkpoint_path, given=set(kwargs)))
        kwargs.setdefault("weights_only", True)
        return super().load_from_checkpoint(checkpoint_path, *args, **kwargs)

    # -- the gradient method -------------------------------------------------------------
    @property
    def method(self) -> GradientMethod:
        """The gradient method in use: ``method=`` if given, else the trainer strategy's."""
        if self._method is not None:
            return self._method
        trainer = self._trainer
        method = getattr(getattr(trainer, "strategy", None), "method", None)
        if not isinstance(method, GradientMethod):
            where = "outside a Trainer" if trainer is None else f"with strategy {type(trainer.strategy).__name__}"
            raise RuntimeError(
                f"{type(self).__name__} is used {where}, which names no gradient method. Use "
                "Trainer(strategy=RTRLStrategy(M=...)) (or TBPTTStrategy / SnAPStrategy, or strategy='rtrl'), "
                "or pass method='rtrl' to the module."
            )
        return method

    @method.setter
    def method(self, method: GradientMethod | str | None) -> None:
        self._method = None if method is None else METHODS.build(method)

    # -- unrolling -----------------------------------------------------------------------
    def encode(self, inputs: Tensor) -> Tensor:
        """Map a segment's raw inputs (M, B, ...) to cell inputs (M, B, D). Default: unchanged."""
        return inputs

    def unroll(self, inputs: Tensor, reset: Tensor, stream: str = "train") -> Tensor:
        """Run the cell over one segment of ``stream`` ("train", "val", ...) and return states (M, B, N).

        The "train" streams use the gradient method; any other stream runs without sensitivities
        (evaluation needs no gradient through time). Each stream name has its own carried state.
        """
        if self.cell is None:
            raise RuntimeError(f"{type(self).__name__} has no cell (a feed-forward model): there is nothing to unroll.")
        method = self.method if stream == "train" else _EVAL
        b = inputs.shape[1] if inputs.dim() >= 2 else -1
        carry = self._carries.get(stream)
        if carry is not None and carry.batch_size != b:
            if stream == "train":
                raise ValueError(
                    f"the training streams changed from B = {carry.batch_size} to B = {b} between segments. Each slot "
                    "of a Segment is one stream whose state is carried: keep B fixed (drop_last=True for a loader)."
                )
            carry = None
        if stream == "train":
            self._check_loader()
        if carry is None:
            carry = method.init_carry(self.cell, b)
        elif carry.device != inputs.device:
            carry = carry.to(inputs.device)
        carry = self._adapt(carry, method)
        # the old carry is replaced right here, so it is given up: RTRL/SnAP then update it in place at M = 1
        donate = {"donate": True} if getattr(method, "supports_donation", False) else {}
        states, self._carries[stream] = method.unroll(self.cell, inputs, reset, carry, **donate)
        return states

    def _adapt(self, carry: Carry | StackCarry, method: GradientMethod) -> Carry | StackCarry:
        # A carry made by another method (resuming with a new strategy) keeps c; missing sensitivities start at zero.
        carry, restarted = method.adapt_carry(self.cell, carry)
        if restarted:
            rank_zero_warn(
                f"The carried state has no sensitivities for {method!r}; they restart from zero (gradients truncate once)."
            )
        return carry

    def carry(self, stream: str = "train") -> Carry | StackCarry | None:
        """The carried state of ``stream`` after the last segment (None before the first); a
        :class:`~onlinerec.gradients.carry.StackCarry` (one carry per layer) for a :class:`~onlinerec.cells.Stack`."""
        return self._carries.get(stream)

    @torch.no_grad()
    def lookahead(self, inputs: Tensor, reset: Tensor, stream: str = "train") -> Tensor:
        """States (M, B, N) of the steps that follow ``stream``'s last segment, without gradient and without
        advancing its carried state (e.g. the state behind an RL bootstrap value)."""
        if self.cell is None:
            raise RuntimeError(f"{type(self).__name__} has no cell (a feed-forward model): there is nothing to unroll.")
        carry = self._carries.get(stream)
        if carry is None or carry.batch_size != inputs.shape[1]:
            carry = _EVAL.init_carry(self.cell, inputs.shape[1])
        return _EVAL.unroll(self.cell, inputs, reset, carry.state_only().to(inputs.device))[0]

    def reset_streams(self, stream: str | None = None) -> None:
        """Forget the carried state of one stream name (or of all)."""
        if stream is None:
            self._carries.clear()
        else:
            self._carries.pop(stream, None)

    @override
    def forward(self, inputs: Tensor, reset: Tensor, stream: str = "train") -> Tensor:
        """Outputs (M, B, ...) = readout of the unrolled states, for one segment of raw inputs."""
        x = self.encode(inputs)
        if self.cell is None:  # feed-forward baseline
            return x
        return self.cell.readout(self.unroll(x, reset, stream), x)

    # -- what a subclass writes ----------------------------------------------------------
    def segment_outputs(self, segment: Segment, stream: str) -> Any:
        """What :meth:`segment_loss` reads: by default ``self(segment.inputs, segment.reset, stream)`` (M, B, ...).
        Override it when a segment is not read whole (R2AC: M steps with gradient, a bootstrap step without)."""
        return self(segment.inputs, segment.reset, stream)

    def segment_loss(self, outputs: Any, segment: Segment) -> Tensor | dict[str, Tensor]:
        """The loss of one segment from :meth:`segment_outputs` (M, B, ...), or a dict with "loss" and more.

        Floating-point entries of the dict are logged as ``<stream>/<name>`` ("train/acc"); integer entries are
        returned to callbacks but not logged. An integer entry ``count`` says how many items the loss averages
        over (e.g. labelled steps): epoch values are then weighted by it. :attr:`current_stream` names the split.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement segment_loss(outputs, segment).")

    @property
    def current_stream(self) -> str | None:
        """The stream name of the segment being processed ("train", "val", "test"), inside :meth:`segment_loss`."""
        return self._current_stream

    # -- the template step (every split) --------------------------------------------------
    def shared_step(self, segment: Segment, stream: str) -> dict[str, Tensor]:
        """Check the batch, run the model over it carrying ``stream``'s state (:meth:`segment_outputs`), compute and
        log :meth:`segment_loss`.

        Returns the loss dict (``"loss"`` first); Lightning backpropagates ``"loss"`` in training.
        """
        if not isinstance(segment, Segment):
            pairs = (
                isinstance(segment, (list, tuple)) and len(segment) == 2 and all(isinstance(x, Tensor) for x in segment)
            )
            hint = (
                " It looks like (inputs, targets) of sequences batched by a DataLoader: deal sequences into streams with "
                "onlinerec.data.SequenceDataModule(train=dataset, ...) instead."
                if pairs
                else ""
            )
            raise TypeError(
                f"{type(self).__name__} trains on onlinerec Segments (M steps x B streams, time-major), but the {stream} "
                f"loader gave a {type(segment).__name__}. Yield Segment(inputs, reset, targets) batches, e.g. from a "
                "SegmentStream or SequenceDataModule; a DataLoader needs batch_size=None so that it does not re-batch "
                f"them.{hint}"
            )
        if stream == "train":
            self._check_steps(segment)
            if not self._order_checked:  # else the strategy had it checked on the host (_check_order_on_host)
                self._continuity.check(segment, continuing="train" in self._carries)
            self._order_checked = False
            if not self._ranks_checked and not segment.distinct_per_rank:
                self._ranks_checked = True
                check_ranks_differ(segment)
        self._current_stream = stream
        try:
            result = self.segment_loss(self.segment_outputs(segment, stream), segment)
        finally:
            self._current_stream = None
        result = dict(result) if isinstance(result, dict) else {"loss": result}
        if "loss" not in result:
            raise KeyError(
                f"{type(self).__name__}.segment_loss returned a dict without 'loss' (keys: {sorted(result)})."
            )
        self.log_step(result, stream, segment.num_streams)
        if (
            stream == "train"
            and self.loss_reduction == "sum"
            and self._trainer is not None
            and self.trainer.world_size > 1
        ):
            result["loss"] = result["loss"] * self.trainer.world_size
        return result

    def log_step(self, result: dict[str, Tensor], stream: str, num_streams: int) -> None:
        """Log the floating-point entries of ``result`` as ``<stream>/<name>``, weighted by ``result["count"]`` if
        present (else by the number of streams). A training segment with ``count`` 0 logs nothing (no labelled step:
        the progress bar keeps the last meaningful loss)."""
        count = result.get("count")
        weight = num_streams if count is None else int(count)
        if weight == 0 and stream == "train":
            return
        for name, value in result.items():
            if isinstance(value, Tensor) and not value.is_floating_point():
                continue
            if isinstance(value, Tensor):
                value = value.detach()
            # epoch-level (evaluation) values are averaged over DDP ranks; training steps log this rank's value
            self.log(
                f"{stream}/{name}",
                value,
                prog_bar=name == "loss",
                batch_size=max(weight, 1),
                sync_dist=stream != "train",
            )

    @override
    def training_step(self, batch: Segment, batch_idx: int) -> dict[str, Tensor]:  # type: ignore[override]
        return self.shared_step(batch, "train")

    @override
    def validation_step(self, batch: Segment, batch_idx: int) -> dict[str, Tensor]:  # type: ignore[override]
        return self.shared_step(batch, "val")

    @override
    def test_step(self, batch: Segment, batch_idx: int) -> dict[str, Tensor]:  # type: ignore[override]
        return self.shared_step(batch, "test")

    def _check_steps(self, segment: Segment) -> None:
        """A training segment must have the strategy's M steps: M is what the method assumes between updates."""
        m = getattr(getattr(self._trainer, "strategy", None), "M", None) if self._trainer is not None else None
        if isinstance(m, int) and segment.steps != m:
            raise ValueError(
                f"the training loader gave a segment of {segment.steps} steps, but the strategy's M is {m} (the steps between "
                f"weight updates). Make the loader read trainer.strategy.M (as SequenceDataModule and RolloutDataModule do), "
                f"or build the strategy with M={segment.steps}."
            )

    def _check_loader(self) -> None:
        """Once per training loader: refuse loaders that shuffle or interleave streams (onlinerec.training.stream_order)."""
        trainer = self._trainer
        loaders = getattr(trainer, "train_dataloader", None) if trainer is not None else None
        if loaders is None or id(loaders) == self._checked_loaders:
            return
        check_stream_order(trainer)
        self._checked_loaders = id(loaders)

    def _check_order_on_host(self, batch: Any) -> None:
        """A training segment's stream order (:class:`~onlinerec.training.stream_order.ContinuityCheck`), checked
        while its sequence ids are still on the host (onlinerec's strategies call this before the batch moves to the
        device): on a GPU the same check would wait for the device."""
        if isinstance(batch, Segment):
            self._continuity.check(batch, continuing="train" in self._carries)
            self._order_checked = True

    @override
    def configure_callbacks(self) -> list[Callback]:
        """Adds :class:`~onlinerec.training.callbacks.FiniteGuard` unless the Trainer already has one (a subclass extends this list)."""
        have = self._trainer.callbacks if self._trainer is not None else []
        return [] if any(isinstance(cb, FiniteGuard) for cb in have) else [FiniteGuard()]

    @override
    def on_fit_start(self) -> None:
        self._ranks_checked = False

    @override
    def on_train_start(self) -> None:
        check_batching(self.trainer.train_dataloader, "training")
        self._check_loader()

    @override
    def on_train_end(self) -> None:
        # Lightning clears callback_metrics when validate/test starts; keep the last fit's train/* there (restored in
        # on_validation_end / on_test_end), so that a validate() after fit() does not lose them.
        self._train_metrics = {k: v for k, v in self.trainer.callback_metrics.items() if k.startswith("train/")}

    @override
    def on_validation_start(self) -> None:
        check_batching(self.trainer.val_dataloaders, "validation")

    @override
    def on_test_start(self) -> None:
        check_batching(self.trainer.test_dataloaders, "test")

    @override
    def on_validation_end(self) -> None:
        self._restore_train_metrics()

    @override
    def on_test_end(self) -> None:
        self._restore_train_metrics()

    def _restore_train_metrics(self) -> None:
        if self._trainer is not None and not self.trainer.training and self.trainer.state.fn != "fit":
            for key, value in getattr(self, "_train_metrics", {}).items():
                self.trainer.callback_metrics.setdefault(key, value)

    @override
    def on_validation_epoch_start(self) -> None:
        self.reset_streams("val")  # every evaluation starts its streams afresh

    @override
    def on_test_epoch_start(self) -> None:
        self.reset_streams("test")

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)

    @override
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Stores the carried state of every rank: under DDP it is gathered to rank 0, which writes the file.

        A cell among the hyper-parameters (a subclass's ``save_hyperparameters()`` with a cell argument) is stored
        as its :func:`~onlinerec.cells.cell_spec`, not as the module, so that the file loads weights-only; a cell
        class defined in ``__main__`` is named in a warning (no other process can import it)."""
        _warn_main_cells(self.cell)
        checkpoint[CARRY_KEY] = {}
        hparams = checkpoint.get(self.CHECKPOINT_HYPER_PARAMS_KEY)
        if isinstance(hparams, dict):
            specs = _cell_specs(hparams)
            if specs:
                checkpoint[self.CHECKPOINT_HYPER_PARAMS_KEY] = {**hparams, **specs}
                checkpoint[CARRY_KEY]["cell_hparams"] = sorted(specs)
        carries = {k: v.to("cpu").state_dict() for k, v in self._carries.items()}
        world, rank = _world()
        per_rank = [carries]
        if world > 1:
            gathered: list[Any] | None = [None] * world if rank == 0 else None
            dist.gather_object(carries, gathered, dst=0)  # every rank calls this: Lightning saves collectively
            per_rank = gathered if gathered is not None else []
        # "carries" is rank 0's (the whole state in a single-process run); torch.save stores shared tensors once.
        checkpoint[CARRY_KEY].update(world_size=world, carries=per_rank[0] if per_rank else {}, rank_carries=per_rank)

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Restores this rank's carried state; refuses (when fitting) a checkpoint saved by a different number of ranks."""
        if self._trainer is not None and isinstance(self._trainer.precision_plugin, DoublePrecision):
            # Lightning loads the weights before its precision plugin converts the module: with precision="64-true"
            # they would pass through float32 parameters and lose their low bits, so the resume would not be exact.
            self.double()
        saved = checkpoint.get(CARRY_KEY, {})
        per_rank = saved.get("rank_carries")
        if per_rank is None:  # written before per-rank carries existed
            per_rank = [saved.get("carries", {})]
        saved_world = int(saved.get("world_size", len(per_rank)))
        world, rank = _world()
        if saved_world != world:
            fitting = self._trainer is not None and self._trainer.state.fn == "fit"
            if fitting and any(per_rank):
                raise ValueError(
                    f"this checkpoint holds the carried state of {saved_world} training process(es), one per rank for its "
                    f"own streams, but this run has {world}. Carried state cannot be re-dealt to other ranks: resume with "
                    f"the same number of processes (devices x num_nodes = {saved_world}), or start every stream afresh "
                    "from a copy without carried state: onlinerec.training.checkpoint.drop_carried_state(path)."
                )
            if any(per_rank):
                rank_zero_warn(
                    f"Carried state saved by {saved_world} process(es) is not restored in a run of {world}; streams start from zero."
                )
            self._carries = {}
            return
        self._carries = {k: load_carry(v) for k, v in per_rank[rank].items()}


_WARNED_MAIN_CELLS: set[str] = set()


def _warn_main_cells(cell: ElementwiseCell | None) -> None:
    """Warn once per class about cell classes defined in ``__main__``: a checkpoint names them ``__main__.<Name>``."""
    if cell is None:
        return
    for module in cell.modules():
        cls = type(module)
        if not isinstance(module, ElementwiseCell) or cls.__module__ != "__main__":
            continue
        if cls.__qualname__ in _WARNED_MAIN_CELLS:
            continue
        _WARNED_MAIN_CELLS.add(cls.__qualname__)
        name = cls.__qualname__
        rank_zero_warn(
            f"The cell class {name} is defined in __main__ (the script being run), which no other process can "
            f"import, so no other process can rebuild it from this checkpoint alone. Define {name} in an importable "
            f"module (e.g. my_cells.py, and `from my_cells import {name}` in this script), or pass the cell when "
            f"loading: load_from_checkpoint(path, cell={name}(...))."
        )


def _cell_specs(hparams: dict[str, Any]) -> dict[str, Any]:
    """The hyper-parameters that are cells (or lists of cells), as their cell_spec; those that cannot be described
    (a class defined in a function, constructor arguments that are not plain data) are left as they are."""
    specs = {}
    for key, value in hparams.items():
        cells = value if isinstance(value, (list, tuple)) else [value]
        if cells and all(isinstance(c, ElementwiseCell) for c in cells):
            try:
                specs[key] = cell_reference(value)
            except (TypeError, ValueError):
                continue
    return specs


def _saved_cells(path: str | os.PathLike, given: set[str]) -> dict[str, Any]:
    """The cells that :meth:`OnlineRecurrentModule.on_save_checkpoint` stored as specs in the checkpoint at ``path``,
    rebuilt, except those ``given`` as keyword arguments (a cheap read: the weights are memory-mapped, not loaded)."""
    try:
        ckpt = peek_checkpoint(path)
    except Exception:  # noqa: BLE001 - Lightning's own load reports whatever is wrong with the file
        return {}
    names = (ckpt.get(CARRY_KEY) or {}).get("cell_hparams") or []
    hparams = ckpt.get(OnlineRecurrentModule.CHECKPOINT_HYPER_PARAMS_KEY) or {}
    return {name: _rebuild(hparams[name]) for name in names if name in hparams and name not in given}


def _rebuild(spec: Any) -> Any:
    if isinstance(spec, list):
        return [_rebuild(s) for s in spec]
    return build_cell_spec(spec) if isinstance(spec, dict) else spec


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


_EVAL = TBPTT()
