"""Through-time gradient methods: the functional core (``init_carry`` / ``unroll``), pure torch.

The Lightning strategies that pick a method for a Trainer live in :mod:`onlinerec.training.strategies` and are
derived from :data:`METHODS`.
"""

from onlinerec.gradients.base import GradientMethod
from onlinerec.gradients.carry import Carry, StackCarry, load_carry
from onlinerec.gradients.check import check_gradients
from onlinerec.gradients.derivatives import ClosedFormMismatchError
from onlinerec.gradients.elementwise import NotElementwiseError
from onlinerec.gradients.rtrl import RTRL
from onlinerec.gradients.sensitivity import SensitivityMethod
from onlinerec.gradients.snap import SnAP
from onlinerec.gradients.tbptt import TBPTT
from onlinerec.registry import Registry

METHODS: Registry[GradientMethod] = Registry(
    "gradient method", GradientMethod, {"rtrl": RTRL, "tbptt": TBPTT, "snap": SnAP}
)
"""Gradient methods by name: the one list behind ``method=`` of every module, the strategies' aliases and the CLI."""

__all__ = [
    "METHODS",
    "RTRL",
    "TBPTT",
    "Carry",
    "ClosedFormMismatchError",
    "GradientMethod",
    "NotElementwiseError",
    "SensitivityMethod",
    "SnAP",
    "StackCarry",
    "check_gradients",
    "load_carry",
]
