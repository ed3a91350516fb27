"""Console widgets: the virtual instances table and the status header."""

from .instance_table import InstanceTable
from .status_header import StatusHeader

__all__ = ["InstanceTable", "StatusHeader"]
