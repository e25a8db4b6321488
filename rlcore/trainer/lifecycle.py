"""What every trainer's run does around its loop, whatever the loop (PPO/GRPO in rlcore.train, SFT and reward
models in rlcore.trainer.supervised): where it resumes from, its worker groups on their device pools, and the
session around it (trackers, the Ray cluster, teardown, the closing report)."""

from __future__ import annotations

import os
from contextlib import contextmanager

from rlcore.config import ConfigError
from rlcore.utils.checkpoint import LATEST, damage, resume_candidate


def resume_from(trainer_cfg) -> str | None:
    """The step folder to resume from under trainer.resume_mode: auto (the newest verified step in
    default_local_dir, warning about damaged newer ones), disable (None), or resume_path (trainer.resume_from_path,
    which must verify: a damaged one stops the run, naming the file and the newest good step to use instead)."""
    mode, root = trainer_cfg.resume_mode, os.path.abspath(os.path.expanduser(trainer_cfg.default_local_dir))
    if mode == "disable":
        return None
    if mode == "resume_path":
        path = os.path.abspath(os.path.expanduser(trainer_cfg.resume_from_path))
        problem = damage(path)
        if problem is not None:
            parent = os.path.dirname(path)
            good, _ = resume_candidate(parent) if os.path.isfile(os.path.join(parent, LATEST)) else (None, [])
            hint = f"use trainer.resume_from_path={good}" if good and good != path else "point trainer.resume_from_path at a complete global_step_N folder"
            raise ConfigError([f"trainer.resume_from_path: {problem}; {hint}"])
        return path
    path, warnings = resume_candidate(root)
    for warning in warnings:
        print(f"WARNING: {warning}", flush=True)
    return path


def cpus_per_rank(device: str, ranks: int) -> int:
    """CPU ranks split the cluster's cores evenly (one rank on 2 cores computes with 2 threads); a GPU rank takes 1."""
    import ray

    return max(1, int(ray.cluster_resources().get("CPU", 1)) // ranks) if device == "cpu" else 1


def build_groups(trainer_cfg, config, shapes: list[tuple[int, int]], where: dict[str, int], classes: dict[str, type],
                 check_dir: bool, micro: dict | None = None) -> tuple[dict, list]:
    """One Ray worker group per role, a process per device of its pool: pools `shapes` [(nnodes, n_gpus_per_node)],
    `where[role]` the pool a role runs on (roles sharing a pool are colocated), `classes[role]` its worker class.
    Prints the rank -> node map; `check_dir`: every rank must see trainer.default_local_dir. `micro`: the run plan's
    micro-batches, sent to every role (rlcore.workers.common.RoleWorker). Torn down on failure."""
    from rlcore.controller.placement import ResourcePool, check_shared_dir, placement_map
    from rlcore.controller.ray_group import RayWorkerGroup, ray_runtime_env
    from rlcore.trainer.profiling import nsight_runtime_env

    t = trainer_cfg
    cpus = cpus_per_rank(t.device, sum(n * g for n, g in shapes))
    pools = [ResourcePool(n, g, t.device, max_colocate_count=list(where.values()).count(i), cpus_per_rank=cpus,
                          timeout_s=t.placement_timeout_s) for i, (n, g) in enumerate(shapes)]
    groups = {}
    try:
        for role, pool in where.items():
            groups[role] = RayWorkerGroup(classes[role], pools[pool], hang_timeout_s=t.hang_timeout_s,
                                          collective_timeout_s=collective_timeout_s(config), config=config,
                                          nsight=nsight_runtime_env(config, role), micro=micro,
                                          runtime_env=ray_runtime_env(config.ray_kwargs.ray_init))
        if getattr(t, "verbosity", "full") == "full":
            print(placement_map(groups), flush=True)
        if check_dir:
            check_shared_dir(groups, t.default_local_dir)
    except BaseException:
        teardown(groups, pools, graceful=True)
        raise
    return groups, pools


def collective_timeout_s(config) -> float:
    """actor_rollout_ref.nccl_timeout (verl's name; gloo's collectives honour it too). The SFT and reward-model
    trainers have no such key: the schema's default, as a PPO run that leaves it alone."""
    from rlcore.config.schema import ActorRolloutRefConfig

    section = getattr(config, "actor_rollout_ref", None)
    return section.nccl_timeout if section is not None else ActorRolloutRefConfig.nccl_timeout


def teardown(groups: dict, pools: list, graceful: bool) -> None:
    """Ends every worker (gracefully: each leaves its process group first) and frees the pools' devices."""
    for group in groups.values():
        group.kill(graceful=graceful)
    for pool in pools:
        pool.release()


@contextmanager
def run_session(cfg, run_dir: str, total_steps: int, **tracker_kwargs):
    """A run's outer shell, the same for every trainer: one controller thread, the trackers open for the run, a
    Ray cluster (local unless ray_kwargs.ray_init.address / RAY_ADDRESS names one) that is shut down on any exit,
    and, after a run that finished, the utilisation report and plots.png. Yields the Tracker."""
    import torch

    from rlcore.config.typed import plain
    from rlcore.controller.ray_group import ray_runtime_env
    from rlcore.controller.ray_session import ray_cluster, write_timeline
    from rlcore.telemetry.run_end import finish_run
    from rlcore.telemetry.tracking import Tracker, logger_names

    # The controller only does bookkeeping (batch reshaping, rewards, advantages) on small tensors; extra
    # intra-op threads there just contend with the workers for cores (measured: 8 ms vs 20 us per index op).
    # The caller's setting comes back afterwards: a program that trains and then computes (the reward-model demo
    # mines hard negatives with the model it just trained) would otherwise run on one thread.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    # trainer.verbosity=short (sweeps): no line per step and no bar; the report is kept in report.txt, one line printed.
    verbosity = getattr(cfg.trainer, "verbosity", "full")  # the SFT and reward-model trainers have no such key
    loggers = [name for name in logger_names(cfg.trainer.logger) if verbosity == "full" or name != "console"]
    tracker = Tracker(loggers, run_dir, total_steps, project_name=cfg.trainer.project_name,
                      experiment_name=cfg.trainer.experiment_name, config=plain(cfg), **tracker_kwargs)
    try:
        ray_init = cfg.ray_kwargs.ray_init
        with ray_cluster(ray_init.address, ray_init.num_cpus, ray_runtime_env(ray_init)):
            try:
                yield tracker
            finally:
                if cfg.ray_kwargs.timeline_json_file:
                    write_timeline(cfg.ray_kwargs.timeline_json_file)
    finally:
        tracker.close()
        torch.set_num_threads(threads)
    finish_run(run_dir, verbosity)
    if verbosity == "full" and tracker.closing:
        print("\n".join(tracker.closing), flush=True)
