"""Through-time gradient methods (functional core) and their Lightning strategies."""

from onlinerec.gradients.base import GradientMethod
from onlinerec.gradients.carry import Carry
from onlinerec.gradients.check import check_gradients
from onlinerec.gradients.derivatives import NotElementwiseError
from onlinerec.gradients.rtrl import RTRL
from onlinerec.gradients.snap import SnAP
from onlinerec.gradients.tbptt import TBPTT

__all__ = ["RTRL", "TBPTT", "Carry", "GradientMethod", "NotElementwiseError", "SnAP", "check_gradients"]
