"""Worker groups on Ray: one actor per rank, placed by a placement group, called through dispatch modes."""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rlcore.controller.decorator import DISPATCH_ATTR, MESH_ATTR, DataLayout, dispatch_and_collect


@dataclass
class ResourcePool:
    """`nnodes x n_gpus_per_node` ranks; on CPU one bundle of `cpus_per_rank` CPUs per rank (each rank runs that
    many torch threads), on CUDA one GPU (+1 CPU) per rank.

    `max_colocate_count` worker groups may share the pool: each rank of each group takes that fraction of its
    bundle, so e.g. the actor group and the critic group run one process each on every device (their phases
    alternate, and offload frees the device for the other). The placement group lives until `release()`.
    """

    nnodes: int
    n_gpus_per_node: int
    device: str = "cpu"
    max_colocate_count: int = 1
    cpus_per_rank: int = 1
    _pg: object = field(default=None, repr=False)

    @property
    def world_size(self) -> int:
        return self.nnodes * self.n_gpus_per_node

    def bundle(self) -> dict[str, float]:
        return {"CPU": 1, "GPU": 1} if self.device == "cuda" else {"CPU": self.cpus_per_rank}

    def share(self) -> dict[str, float]:
        """What one rank of one colocated group asks of its bundle."""
        return {k: v / self.max_colocate_count for k, v in self.bundle().items()}

    def placement_group(self, timeout_s: float = 120.0):
        if self._pg is None:
            self._pg = self._create_placement_group(timeout_s)
        return self._pg

    def release(self) -> None:
        if self._pg is not None:
            remove_placement_group(self._pg)
            self._pg = None

    def _create_placement_group(self, timeout_s: float):
        pg = placement_group([self.bundle() for _ in range(self.world_size)], strategy="PACK" if self.nnodes == 1 else "SPREAD")
        ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
        if not ready:
            have = ray.cluster_resources()
            raise RuntimeError(
                f"Ray could not place {self.world_size} ranks of {self.bundle()} within {timeout_s:.0f}s; cluster has {have}. "
                "Lower trainer.n_gpus_per_node / trainer.nnodes or add resources (ray_kwargs.ray_init.num_cpus)."
            )
        return pg


class RayWorkerGroup:
    """Creates `world_size` actors of `worker_cls`, wires their process group, and exposes registered methods.

    Colocated roles (actor + rollout + reference, verl's hybrid engine) live in ONE worker class, so they share
    the process and the device; a second role (e.g. a critic) is another group on the same pool (or its own).
    """

    def __init__(self, worker_cls: type, pool: ResourcePool, name: str = "worker", **init_kwargs: Any) -> None:
        self.pool = pool
        self.world_size = pool.world_size
        pg = pool.placement_group()
        share = pool.share()
        remote_cls = ray.remote(worker_cls)
        # On CPU a rank computes with the cores of its bundle (Ray would otherwise pin it to one thread per
        # requested CPU, and a colocated group's fractional share to one); colocated groups alternate phases, so
        # each of their processes may use the whole bundle.
        env = {"OMP_NUM_THREADS": str(pool.cpus_per_rank), "TOKENIZERS_PARALLELISM": "false"} if pool.device == "cpu" else {}
        self.workers = [
            remote_cls.options(
                name=None,
                num_cpus=share["CPU"],
                num_gpus=share.get("GPU", 0),
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=rank),
                runtime_env={"env_vars": env} if env else None,
            ).remote(rank=rank, world_size=self.world_size, device=pool.device, **init_kwargs)
            for rank in range(self.world_size)
        ]
        self._layouts: dict[str | None, list[DataLayout]] = {None: [DataLayout(r, self.world_size) for r in range(self.world_size)]}
        master_addr, master_port = ray.get(self.workers[0].get_master_addr_port.remote())
        ray.get([w.init_process_group.remote(master_addr, master_port) for w in self.workers])
        self._bind_registered_methods(worker_cls)

    def _bind_registered_methods(self, worker_cls: type) -> None:
        for name, fn in inspect.getmembers(worker_cls, predicate=inspect.isfunction):
            mode = getattr(fn, DISPATCH_ATTR, None)
            if mode is not None:
                setattr(self, name, self._group_method(name, mode, getattr(fn, MESH_ATTR, None)))

    def layouts(self, mesh: str | None) -> list[DataLayout]:
        """Each rank's place in the data-parallel layout `mesh`, asked of the workers once (after init_model)."""
        if mesh not in self._layouts:
            self._layouts[mesh] = ray.get([w.data_layout.remote(mesh) for w in self.workers])
        return self._layouts[mesh]

    def dp_size(self, mesh: str | None = None) -> int:
        return self.layouts(mesh)[0].dp_size

    def _group_method(self, name: str, mode, mesh: str | None):
        def call(per_rank_args: list[tuple], per_rank_kwargs: list[dict]) -> list[Any]:
            refs = [getattr(w, name).remote(*a, **k) for w, a, k in zip(self.workers, per_rank_args, per_rank_kwargs)]
            return ray.get(refs)

        def group_method(*args: Any, **kwargs: Any) -> Any:
            return dispatch_and_collect(mode, self.layouts(mesh), call, args, kwargs)

        group_method.__name__ = name
        return group_method

    def kill(self, graceful: bool = True) -> None:
        """Tears the group down: destroys the process group (if graceful) and kills the actors. The pool's
        placement group stays (another group may share it): `pool.release()` frees it."""
        if graceful:
            try:
                ray.get([w.shutdown.remote() for w in self.workers], timeout=30)
            except Exception:
                pass  # a dead actor cannot tear down its process group; killing it is what matters
        for w in self.workers:
            ray.kill(w)


def init_ray(address: str | None, num_cpus: int | None) -> bool:
    """Joins `address` (config) or RAY_ADDRESS if given, else starts a local cluster. Returns True if we started it."""
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=True)
        return False
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=True, configure_logging=False)
    return True
