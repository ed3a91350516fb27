"""Console screens: instances, detail, side views and dialogs."""

from .detail import DetailScreen
from .dialogs import ChoiceScreen, ConfirmScreen, HelpScreen
from .instances import InstancesScreen
from .views import EventsScreen, FlowsScreen, WorkersScreen

__all__ = [
    "ChoiceScreen",
    "ConfirmScreen",
    "DetailScreen",
    "EventsScreen",
    "FlowsScreen",
    "HelpScreen",
    "InstancesScreen",
    "WorkersScreen",
]
