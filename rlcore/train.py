"""`python -m rlcore.train key=value ...` / `rlcore-train`: verl's main_ppo command line, on rlcore.

Everything that can be checked is checked before Ray starts: the config (batch arithmetic, choices,
unsupported features), algorithm names, model/tokenizer/data paths. Then the controller starts (or joins) Ray,
builds the colocated actor/rollout/ref worker group and runs `PPOTrainer.fit()`.
"""

from __future__ import annotations

import os

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from rlcore.config import CONFIG_DIR, ConfigError, format_plan, register_configs, validate_config

register_configs()


def runtime_errors(cfg: DictConfig) -> list[str]:
    """Checks that need torch or the algorithm registries (kept out of the import-light config package)."""
    import torch

    from rlcore.algos import ADV_ESTIMATORS, KL_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES
    from rlcore.trainer.tracking import logger_errors

    actor, errors = cfg.actor_rollout_ref.actor, []
    for registry, value in (
        (ADV_ESTIMATORS, cfg.algorithm.adv_estimator), (POLICY_LOSSES, actor.policy_loss.loss_mode),
        (KL_ESTIMATORS, actor.kl_loss_type), (KL_ESTIMATORS, cfg.algorithm.kl_penalty), (LOSS_AGGREGATIONS, actor.loss_agg_mode),
    ):
        if value not in registry:
            errors.append(f"{registry.config_key}={value!r} is not a registered {registry.kind}; valid: {', '.join(registry.names())}")
    errors.extend(logger_errors(list(cfg.trainer.logger)))
    if cfg.trainer.device == "cuda" and not torch.cuda.is_available():
        errors.append("trainer.device=cuda but no CUDA device is visible; set trainer.device=cpu to run on CPU (gloo)")
    return errors


def check_config(cfg: DictConfig):
    """Every config problem, schema rules and runtime checks alike, in ONE error; else the batch plan."""
    errors, plan = [], None
    try:
        plan = validate_config(cfg)
    except ConfigError as err:
        errors.extend(err.messages)
    errors.extend(runtime_errors(cfg))
    if errors:
        raise ConfigError(errors)
    return plan


def absolute_paths(cfg: DictConfig) -> None:
    """Ray workers may not share the driver's working directory: make every local path absolute."""
    model = cfg.actor_rollout_ref.model
    model.path = os.path.abspath(os.path.expanduser(model.path))
    if model.tokenizer_path:
        model.tokenizer_path = os.path.abspath(os.path.expanduser(model.tokenizer_path))
    cfg.trainer.default_local_dir = os.path.abspath(os.path.expanduser(cfg.trainer.default_local_dir))


def run(cfg: DictConfig, run_dir: str) -> dict[str, float]:
    """Trains with a composed config; returns the final step's metrics. Cleans up Ray and workers on any exit."""
    print(format_plan(check_config(cfg)), flush=True)
    absolute_paths(cfg)
    import torch

    # The controller only does bookkeeping (batch reshaping, rewards, advantages) on small tensors; extra
    # intra-op threads there just contend with the workers for cores (measured: 8 ms vs 20 us per index op).
    torch.set_num_threads(1)

    import ray

    from rlcore.controller.ray_group import init_ray
    from rlcore.trainer.ppo import PPOTrainer
    from rlcore.trainer.setup import build_data, build_reward_fns, total_training_steps
    from rlcore.trainer.tracking import Tracker

    tokenizer, train_loader, val_loader = build_data(cfg)
    reward_fn, val_reward_fn = build_reward_fns(cfg, tokenizer)
    total_steps = total_training_steps(cfg, train_loader)
    tracker = Tracker(list(cfg.trainer.logger), run_dir, total_steps)
    started_ray = init_ray(cfg.ray_kwargs.ray_init.address, cfg.ray_kwargs.ray_init.num_cpus)
    try:
        return train_with_restarts(cfg, total_steps, lambda group, restart, restart_from, val_history: PPOTrainer(
            cfg, group, reward_fn, val_reward_fn, train_loader, val_loader, tracker, total_steps, restart, restart_from, val_history))
    finally:
        tracker.close()
        if started_ray:
            ray.shutdown()


def train_with_restarts(cfg: DictConfig, total_steps: int, make_trainer) -> dict[str, float]:
    """Runs fit() on a fresh worker group; if a worker process dies, rebuilds the group and continues from this
    run's last checkpoint, up to trainer.max_worker_restarts times (default 0: fail at once, like verl)."""
    from ray.exceptions import RayActorError

    from rlcore.controller.ray_group import RayWorkerGroup, ResourcePool
    from rlcore.workers.actor_rollout_ref import ActorRolloutRefWorker

    restarts_left, restart, restart_from, val_history = cfg.trainer.max_worker_restarts, False, None, None
    while True:
        group = RayWorkerGroup(ActorRolloutRefWorker, ResourcePool(cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node, cfg.trainer.device),
                               config=OmegaConf.to_container(cfg, resolve=True))
        trainer, crashed = make_trainer(group, restart, restart_from, val_history), False
        try:
            group.init_model(total_steps)
            metrics = trainer.fit()
            trainer.report_validation()
            return metrics
        except RayActorError as err:
            crashed = True
            where = trainer.last_checkpoint or "no checkpoint yet (trainer.save_freq)"
            if restarts_left <= 0:
                hint = (f"Rerun the same command to resume from {where} (trainer.resume_mode=auto)" if trainer.last_checkpoint
                        else "No checkpoint was written yet: set trainer.save_freq to keep progress across crashes")
                raise SystemExit(
                    f"rlcore: a worker process died at global step {trainer.global_step}: {str(err).splitlines()[0]}\n"
                    f"Its log is under /tmp/ray/session_latest/logs (worker-*.err). {hint}; "
                    "trainer.max_worker_restarts=N restarts the workers automatically."
                ) from err
            restarts_left -= 1
            restart, restart_from, val_history = True, trainer.last_checkpoint, trainer.val_history
            print(f"WARNING rlcore: a worker process died at global step {trainer.global_step} ({str(err).splitlines()[0]}); "
                  f"restarting the workers from {where} ({restarts_left} restarts left)", flush=True)
        finally:
            # After a crash the surviving ranks are stuck in a collective with the dead one: no graceful teardown.
            group.kill(graceful=not crashed)


@hydra.main(config_path=CONFIG_DIR, config_name="ppo_trainer", version_base=None)
def main(cfg: DictConfig) -> None:
    try:
        run(cfg, HydraConfig.get().runtime.output_dir)
    except ConfigError as err:
        # A user mistake: print every problem with its fix, no traceback.
        raise SystemExit(f"rlcore: invalid configuration\n{err}") from None


if __name__ == "__main__":
    main()
