"""Where ranks run: node-major placement groups, the rank -> node map, and the checks a multi-node run needs."""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field

import ray
from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group

from rlcore.controller.hosts import Parked, kill_all, warm


@dataclass
class ResourcePool:
    """`nnodes x n_gpus_per_node` ranks, placed node-major: one STRICT_PACK placement group of `n_gpus_per_node`
    bundles per node, so ranks `[i * n_gpus_per_node, (i + 1) * n_gpus_per_node)` share a node and every TP group
    of contiguous ranks (rollout TP, Megatron TP) that divides `n_gpus_per_node` stays inside one. On CPU a bundle
    is `cpus_per_rank` CPUs (each rank runs that many torch threads), on CUDA one GPU (+1 CPU).

    `max_colocate_count` worker groups may share the pool: each rank of each group takes that fraction of the
    same bundle, so e.g. the actor and the critic run one process each on every device (their phases alternate,
    and offload frees the device for the other). The placement groups live until `release()`, which parks them with
    their idle worker hosts while rlcore's own cluster keeps hosts warm (rlcore.controller.hosts).
    """

    nnodes: int
    n_gpus_per_node: int
    device: str = "cpu"
    max_colocate_count: int = 1
    cpus_per_rank: int = 1
    timeout_s: float = 120.0  # trainer.placement_timeout_s
    _pgs: list = field(default_factory=list, repr=False)
    _idle: dict = field(default_factory=dict, repr=False)  # (rank, host options) -> idle host actors

    def key(self) -> tuple:
        """What makes two pools' placement groups interchangeable."""
        return self.nnodes, self.n_gpus_per_node, self.device, self.cpus_per_rank

    @property
    def world_size(self) -> int:
        return self.nnodes * self.n_gpus_per_node

    def bundle(self) -> dict[str, float]:
        return {"CPU": 1, "GPU": 1} if self.device == "cuda" else {"CPU": self.cpus_per_rank}

    def share(self) -> dict[str, float]:
        """What one rank of one colocated group asks of its bundle."""
        return {k: v / self.max_colocate_count for k, v in self.bundle().items()}

    def placement_groups(self) -> list:
        """One ready placement group per node, in node order (created on first use)."""
        if not self._pgs:
            parked = warm().take(self.key()) if warm() else None
            if parked is not None:
                self._pgs, self._idle = parked.pgs, parked.hosts
            else:
                self._pgs = self._create_placement_groups()
        return self._pgs

    def rank_bundle(self, rank: int) -> tuple[object, int]:
        """The (placement group, bundle index) rank `rank` runs in: node-major."""
        return self.placement_groups()[rank // self.n_gpus_per_node], rank % self.n_gpus_per_node

    def take_host(self, rank: int, options: tuple):
        """An idle host for `rank` started with `options` (rlcore.controller.hosts.host_options), or None."""
        self.placement_groups()
        idle = self._idle.get((rank, options))
        if idle:
            return idle.pop()
        # Hosts started otherwise hold their share of the bundle a new host needs: they go
        for (r, _), hosts in self._idle.items():
            while r == rank and hosts:
                ray.kill(hosts.pop())
        return None

    def park_host(self, rank: int, options: tuple, actor) -> bool:
        """Keeps a retired rank's clean host for the next group on this pool, if hosts are kept warm."""
        if warm() is None or not self._pgs:
            return False
        self._idle.setdefault((rank, options), []).append(actor)
        return True

    def release(self) -> None:
        parked, self._pgs, self._idle = Parked(self.key(), self._pgs, self._idle), [], {}
        if warm() is not None and parked.pgs:
            warm().park(parked)
        else:
            kill_all(parked)

    def _create_placement_groups(self) -> list:
        """Node by node, each group on a node none of the earlier ones took (Ray's node-id label), so `nnodes`
        groups mean `nnodes` machines even where one machine has room for two. One deadline for all of them."""
        deadline, pgs, taken = time.monotonic() + self.timeout_s, [], []
        try:
            for i in range(self.nnodes):
                away = [{"ray.io/node-id": f"!in({','.join(taken)})"}] * self.n_gpus_per_node if taken else None
                pg = placement_group([self.bundle()] * self.n_gpus_per_node, strategy="STRICT_PACK", bundle_label_selector=away)
                pgs.append(pg)
                ready, _ = ray.wait([pg.ready()], timeout=max(0.0, deadline - time.monotonic()))
                if not ready:
                    raise RuntimeError(self._placement_error(i))
                taken.append(placement_group_table(pg)["bundles_to_node_id"][0])
        except BaseException:
            for pg in pgs:
                remove_placement_group(pg)
            raise
        return pgs

    def _placement_error(self, placed: int) -> str:
        need = {k: v * self.n_gpus_per_node for k, v in self.bundle().items()}
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        fit = [n for n in nodes if all(n["Resources"].get(k, 0) >= v for k, v in need.items())]
        have = "; ".join(f"{n['NodeManagerAddress']} ({n['NodeID'][:8]}): "
                         + ", ".join(f"{k} {n['Resources'].get(k, 0):g}" for k in need) for n in nodes)
        return (f"Ray placed {placed} of trainer.nnodes={self.nnodes} nodes of {need} (trainer.n_gpus_per_node="
                f"{self.n_gpus_per_node} ranks of {self.bundle()}) within {self.timeout_s:.0f}s (trainer.placement_timeout_s). "
                f"The cluster has {len(nodes)} live node(s), {len(fit)} with room for one: {have}. "
                + ('Start ' + str(self.nnodes - len(fit)) + ' more node(s) (ray start --address=...) or lower trainer.nnodes'
                   if len(fit) < self.nnodes else 'Free the resources other jobs hold')
                + f", or lower trainer.n_gpus_per_node (on CPU: ray_kwargs.ray_init.num_cpus).")


def placement_map(groups: dict) -> str:
    """Which node each rank of each worker group runs on, node by node (printed at start-up)."""
    driver = ray.get_runtime_context().get_node_id()
    nodes: dict[str, tuple[str, list[str]]] = {}
    for role, group in groups.items():
        by_node: dict[str, list[int]] = {}
        for rank, (ip, _, node_id) in enumerate(group.processes):
            by_node.setdefault(node_id, []).append(rank)
            nodes.setdefault(node_id, (ip, []))
        for node_id, ranks in by_node.items():
            nodes[node_id][1].append(f"{role} ranks {_span(ranks)}")
    lines = [f"rlcore: rank -> node map ({len(nodes)} node{'s' if len(nodes) > 1 else ''})"]
    for i, (node_id, (ip, roles)) in enumerate(nodes.items()):
        lines.append(f"  node {i} {node_id[:8]} @ {ip}{' (driver)' if node_id == driver else ''}: {'; '.join(roles)}")
    return "\n".join(lines)


def _span(ranks: list[int]) -> str:
    return f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 and ranks == list(range(ranks[0], ranks[-1] + 1)) else ",".join(map(str, ranks))


def check_shared_dir(groups: dict, directory: str, key: str = "trainer.default_local_dir") -> None:
    """Every rank writes its checkpoint shards under `directory` and the controller reads them back (manifest,
    resume): ranks on other nodes must see the driver's files there. Writes a marker and asks every rank to read it."""
    driver = ray.get_runtime_context().get_node_id()
    if all(node == driver for group in groups.values() for _, _, node in group.processes):
        return
    os.makedirs(directory, exist_ok=True)
    token = uuid.uuid4().hex
    marker = os.path.join(directory, f".rlcore_shared_{token}")
    with open(marker, "w") as f:
        f.write(token)
    try:
        blind = []
        for role, group in groups.items():
            seen = ray.get([w.read_marker.remote(marker) for w in group.workers])
            blind += [f"{role} rank {r} on {group.processes[r][0]} ({group.processes[r][2][:8]})" for r, text in enumerate(seen) if text != token]
    finally:
        os.remove(marker)
    if blind:
        raise RuntimeError(
            f"{key}={directory} is not visible from {', '.join(blind)}: on several nodes every rank writes its checkpoint "
            f"shards there and the controller reads them back, so it must be a filesystem all nodes share (NFS, Lustre, "
            f"a mounted bucket). Point {key} at one, or set trainer.save_freq=-1 and trainer.resume_mode=disable to run without checkpoints.")
