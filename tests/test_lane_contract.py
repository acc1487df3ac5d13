"""Every lane in `gateway/retrieval/lanes/` is a whole `Lane`: it names itself, says whether
it is essential, whether its ranking of whole documents runs apart from its chunks' and
whether its worker is woken first, and ranks whole documents explicitly (None when it
cannot), so the search never has to ask whether a lane has a method."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import gateway.retrieval.lanes as lanes_package
from gateway.retrieval.lanes.base import Lane


def lane_classes() -> list[type]:
    """Classes with a `run` defined in the lane modules (the protocol itself aside)."""
    found = []
    for module_info in pkgutil.iter_modules(lanes_package.__path__):
        module = importlib.import_module(f"{lanes_package.__name__}.{module_info.name}")
        for _name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and cls is not Lane and "run" in vars(cls):
                found.append(cls)
    return found


def test_every_lane_declares_the_whole_protocol() -> None:
    classes = lane_classes()
    assert {cls.__name__ for cls in classes} >= {"Bm25Lane", "DenseLane", "ExactLane"}
    for cls in classes:
        assert isinstance(cls.name, str) and isinstance(cls.essential, bool), cls
        assert isinstance(vars(cls).get("documents_apart"), bool), cls
        assert isinstance(vars(cls).get("starts_first"), bool), cls
        # Declared on the class itself, not inherited or looked up at run time.
        assert callable(vars(cls).get("rank_documents")), cls
        assert callable(vars(cls).get("at_once")), cls
        for method in ("run", "rank_documents", "at_once"):
            theirs = inspect.signature(getattr(cls, method)).parameters
            assert list(theirs) == list(inspect.signature(getattr(Lane, method)).parameters)
