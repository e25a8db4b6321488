"""Training backends behind one interface (`TrainEngine`); workers never branch on the backend."""

from rlcore.engine.base import EngineSpec, FSDPSpec, TokenRequest, TrainEngine
from rlcore.engine.factory import build_engine

__all__ = ["EngineSpec", "FSDPSpec", "TokenRequest", "TrainEngine", "build_engine"]
