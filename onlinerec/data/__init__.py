"""Data: the Segment batch type and segmented-stream data modules."""

from onlinerec.data.segment import Segment
from onlinerec.data.stream import SegmentStream

__all__ = ["Segment", "SegmentStream"]
