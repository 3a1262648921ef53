"""onlinerec: train recurrent networks online with untruncated gradients (RTRL) in PyTorch Lightning."""

from onlinerec.callbacks import FiniteGuard, NonFiniteError, StreamOrderError
from onlinerec.cells import CELLS, ElementwiseCell, ELSTMCell, FELSTMCell, FullyRecurrentCell, QRNNCell, SRUCell, make_cell
from onlinerec.checkpoint import AtomicCheckpointIO
from onlinerec.data import Segment, SegmentStream
from onlinerec.gradients import RTRL, TBPTT, Carry, GradientMethod, NotElementwiseError, SnAP, check_gradients
from onlinerec.gradients.strategies import STRATEGIES, OnlineStrategy, RTRLStrategy, SnAPStrategy, TBPTTStrategy
from onlinerec.module import OnlineRecurrentModule

__version__ = "0.1.0"

__all__ = [
    "AtomicCheckpointIO",
    "FiniteGuard",
    "NonFiniteError",
    "StreamOrderError",
    "CELLS",
    "RTRL",
    "STRATEGIES",
    "TBPTT",
    "Carry",
    "ELSTMCell",
    "ElementwiseCell",
    "FELSTMCell",
    "FullyRecurrentCell",
    "GradientMethod",
    "NotElementwiseError",
    "OnlineRecurrentModule",
    "OnlineStrategy",
    "QRNNCell",
    "RTRLStrategy",
    "SRUCell",
    "Segment",
    "SegmentStream",
    "SnAP",
    "SnAPStrategy",
    "TBPTTStrategy",
    "check_gradients",
    "make_cell",
]
