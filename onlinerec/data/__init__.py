"""Data: the Segment batch type and segmented-stream data modules."""

from onlinerec.data.segment import Segment

__all__ = ["Segment"]
