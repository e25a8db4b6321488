"""Training backends behind one interface (`TrainEngine`); workers never branch on the backend."""

from rlcore.engine.base import EngineSpec, TokenRequest, TrainEngine
from rlcore.engine.factory import build_engine

__all__ = ["EngineSpec", "TokenRequest", "TrainEngine", "build_engine"]
