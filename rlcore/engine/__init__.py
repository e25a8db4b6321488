"""Training backends behind one interface (`TrainEngine`); workers never branch on the backend."""

from rlcore.engine.base import TrainEngine, build_engine

__all__ = ["TrainEngine", "build_engine"]
