"""`python -m rlcore.train key=value ...` / `rlcore-train`: verl's main_ppo command line, on rlcore.

Everything that can be checked is checked before Ray starts: the config (batch arithmetic, choices,
unsupported features), algorithm names, model/tokenizer/data paths. Then the controller starts (or joins) Ray,
builds the colocated actor/rollout/ref worker group and runs `PPOTrainer.fit()`.
"""

from __future__ import annotations

import os
import sys
import time

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from rlcore.cli.overrides import ComposeError, compose_explained, config_dir_of, expand_sweep, hydra_argv, schema_keys, set_existing_keys, split_argv
from rlcore.cli.preflight import preflight
from rlcore.config import CONFIG_DIR, ConfigError, compose, finish_composition, format_plan, register_configs
from rlcore.config.async_schema import async_warnings
from rlcore.config.key_status import ineffective_settings
from rlcore.config.renamed import renamed_notes
from rlcore.config.schema import PPOConfig
from rlcore.config.typed import dotted, typed
from rlcore.config.validate import uses_critic, uses_reference
from rlcore.plan import format_memory
from rlcore.plan.heads import policy_heads
from rlcore.plan.run_plan import RunPlan, plan_run

register_configs()


def check_config(cfg: DictConfig) -> str:
    """Every config problem (schema rules, the model's limits, runtime checks) in ONE error; else the report:
    the batch plan and the per-device memory plan, with a warning for any role estimated not to fit."""
    return checked_plan(cfg)[1]


def checked_plan(cfg: DictConfig) -> tuple[RunPlan, str]:
    """The run's plan and check_config's report (raises ConfigError as it does)."""
    run_plan, errors = plan_run(cfg, policy_heads(cfg))
    plan, memory = run_plan.batch, run_plan.memory
    checked = preflight(cfg, where="train", known=errors)  # the same checks rlcore-plan runs
    errors += checked.errors
    if errors:
        raise ConfigError(errors)
    report = [f"WARNING rlcore: {line}" for line in ineffective_settings(cfg) + renamed_notes(cfg)]
    # Parts under 10 MiB share a line here (a tiny model's were most of them); `rlcore-plan` lists each.
    report += [format_plan(plan), format_memory(memory, fold_below=0.01)] + [f"WARNING rlcore: {w}" for w in checked.warnings]
    for role in memory.roles:
        if role.verdict == "OOM":
            lever = f"; the largest lever: {role.levers[0][0]}" if role.levers else ""
            report.append(f"WARNING rlcore: {role.role} is estimated at {role.peak:.1f} GiB per device, more than "
                          f"{role.capacity:.1f} GiB: it will likely run out of memory{lever} (rlcore-plan explains)")
    report.extend(cpu_dtype_warnings(cfg))
    report.extend(async_warnings(dotted(cfg)))
    return run_plan, "\n".join(report)


def cpu_dtype_warnings(cfg: DictConfig) -> list[str]:
    """bf16 on a CPU that only emulates it: verl's defaults are bf16, and they would run many times slower than fp32."""
    from rlcore.utils.cpu import half_precision_keys, native_bf16_matmul

    if cfg.trainer.device != "cpu" or native_bf16_matmul():
        return []
    keys = half_precision_keys(cfg, uses_reference(cfg), uses_critic(cfg))
    if not keys:
        return []
    fix = " ".join(f"{k.split('=')[0]}=float32" for k in keys)
    return [f"WARNING rlcore: {', '.join(keys)} on a CPU without native bf16 matmul (AVX-512 BF16 / AMX, with torch's AVX-512 "
            f"kernels): bf16 is emulated there, far slower than float32. Use {fix} (as the tiny_cpu recipes do)"]


def absolute_paths(cfg: DictConfig) -> None:
    """Ray workers may not share the driver's working directory: make every local path absolute."""
    full = lambda path: os.path.abspath(os.path.expanduser(path))  # noqa: E731
    for model in (cfg.actor_rollout_ref.model, cfg.critic.model):
        model.path = full(model.path)
        if model.tokenizer_path:
            model.tokenizer_path = full(model.tokenizer_path)
    if cfg.reward.reward_model.model_path:
        cfg.reward.reward_model.model_path = full(cfg.reward.reward_model.model_path)
    if cfg.reward_model.model.input_tokenizer:
        cfg.reward_model.model.input_tokenizer = full(cfg.reward_model.model.input_tokenizer)
    for teacher in cfg.distillation.teacher_models.values():
        if teacher and teacher.get("model_path"):
            teacher.model_path = full(teacher.model_path)
    cfg.trainer.default_local_dir = full(cfg.trainer.default_local_dir)
    if cfg.custom_algorithms.path:
        cfg.custom_algorithms.path = full(cfg.custom_algorithms.path)


def _command_line() -> list[str]:
    """The overrides of the job Hydra runs (none when run() is called with a composed config: compose() saw them)."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def run(cfg: DictConfig, run_dir: str) -> dict[str, float]:
    """Trains with a composed config; returns the final step's metrics. Cleans up Ray and workers on any exit."""
    finish_composition(cfg, _command_line())  # Hydra composed it (rlcore.config.compose finishes the same for tests and tools)
    plan, report = checked_plan(cfg)  # derived once: the groups' placement and the step report's memory plan read it
    if cfg.trainer.verbosity == "short":  # the plans stay with rlcore-plan; what may go wrong is still said
        report = "\n".join(line for line in report.splitlines() if line.startswith("WARNING"))
    if report:
        print(report, flush=True)
    absolute_paths(cfg)
    cfg = typed(cfg, PPOConfig)  # past validation the controller and the workers read the schema's objects
    from rlcore.trainer.lifecycle import run_session
    from rlcore.trainer.ppo import PPOTrainer
    from rlcore.trainer.setup import build_data, build_reward_fns, total_training_steps

    tokenizer, train_loader, val_loader = build_data(cfg)
    reward_fn, val_reward_fn = build_reward_fns(cfg, tokenizer)
    total_steps = total_training_steps(cfg, train_loader)
    try:
        with run_session(cfg, run_dir, total_steps) as tracker:
            return train_with_restarts(cfg, plan, total_steps, lambda groups, restart, restart_from, val_history: PPOTrainer(
                cfg, groups, reward_fn, val_reward_fn, train_loader, val_loader, tracker, total_steps, restart, restart_from, val_history,
                plan=plan))
    finally:
        reward_fn.close()


def build_worker_groups(cfg: PPOConfig, plan: RunPlan) -> tuple[dict, list]:
    """The actor/rollout/ref group and, when used, the critic, reward-model, rollout and teacher groups, each a
    process per device of its pool (the plan's placement), each handed the plan's micro-batches."""
    from rlcore.trainer.lifecycle import build_groups
    from rlcore.workers.actor_rollout_ref import ActorRolloutRefWorker
    from rlcore.workers.critic import CriticWorker
    from rlcore.workers.reward_model import RewardModelWorker
    from rlcore.workers.rollout import RolloutWorker
    from rlcore.workers.teacher import TeacherWorker

    classes = {"actor_rollout": ActorRolloutRefWorker, "critic": CriticWorker, "reward_model": RewardModelWorker, "rollout": RolloutWorker,
               "teacher": TeacherWorker}
    check_dir = cfg.trainer.save_freq > 0 or cfg.trainer.resume_mode != "disable"
    return build_groups(cfg.trainer, cfg, plan.pools, plan.where, classes, check_dir, plan.micro)


def train_with_restarts(cfg: PPOConfig, plan: RunPlan, total_steps: int, make_trainer) -> dict[str, float]:
    """Runs fit() on fresh worker groups; if a worker process dies, rebuilds them and continues from this run's
    last checkpoint, up to trainer.max_worker_restarts times (default 0: fail at once, like verl)."""
    from ray.exceptions import RayActorError, RayTaskError

    from rlcore.controller.ray_group import WorkerHang
    from rlcore.models.hf import ModelLoadError
    from rlcore.trainer.lifecycle import teardown
    from rlcore.trainer.preemption import StopNow

    restarts_left, restart, restart_from, val_history = cfg.trainer.max_worker_restarts, False, None, None
    while True:
        groups, pools = build_worker_groups(cfg, plan)
        trainer, crashed = make_trainer(groups, restart, restart_from, val_history), False
        try:
            for group in groups.values():
                group.init_model(total_steps)
            metrics = trainer.fit()
            trainer.report_end()
            return metrics
        except StopNow:
            crashed = True  # a second SIGTERM: the ranks may be mid-collective, kill them
            raise
        except WorkerHang as err:
            crashed = True
            where = f"Rerun the same command to resume from {trainer.last_checkpoint}" if trainer.last_checkpoint else "No checkpoint was written yet"
            raise SystemExit(f"rlcore: workers stopped answering at global step {trainer.global_step}:\n{err}\n{where}.") from err
        except RayTaskError as err:
            if not isinstance(err.cause, ModelLoadError):
                raise
            raise SystemExit(f"rlcore: {err.cause}") from None  # the worker's own traceback is in its log
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
            teardown(groups, pools, graceful=not crashed)


@hydra.main(config_path=CONFIG_DIR, config_name="ppo_trainer", version_base=None)
def hydra_main(cfg: DictConfig) -> float:
    """One training job. Returns the final mean reward: the objective a Hydra sweeper (e.g. Optuna) maximises.
    Each job also leaves summary.json in its output directory for the multirun summary table."""
    from rlcore.cli.sweep import write_job_summary

    output_dir, start = HydraConfig.get().runtime.output_dir, time.perf_counter()
    try:
        final = run(cfg, output_dir)
    except ConfigError as err:
        # A user mistake: print every problem with its fix, no traceback.
        raise SystemExit(f"rlcore: invalid configuration\n{err}") from None
    steps = cfg.trainer.total_training_steps or 0
    write_job_summary(output_dir, steps, time.perf_counter() - start)
    return final.get("critic/score/mean", float("nan"))


def main() -> None:
    """rlcore-train: a command line that does not compose (a misspelled key or recipe, a `~` Hydra's grammar
    refuses) is explained in one line with its fix before Hydra sees it; then Hydra runs the job(s)."""
    config_name, config_dir = split_argv(sys.argv[1:], "ppo_trainer")[0], config_dir_of(sys.argv[1:])
    sys.argv[1:] = set_existing_keys(sys.argv[1:], schema_keys(config_name))  # before Hydra reads sys.argv
    refuse_what_does_not_compose(sys.argv[1:], "ppo_trainer", lambda o, config_name: compose(o, config_name=config_name, config_dir=config_dir))
    sys.argv[1:] = hydra_argv(sys.argv[1:])  # a verl example's config folder builds on rlcore's configs
    hydra_main()


def refuse_what_does_not_compose(argv: list[str], default_config: str, compose_with) -> None:
    """Composes every job of the command line as Hydra will (each job of an -m sweep); exits 1 with the first
    problem, explained. Leaves --help, --cfg and other Hydra questions to Hydra."""
    config_name, overrides, sweep, plain = split_argv(argv, default_config)
    if not plain:
        return
    try:
        for job in expand_sweep(overrides, basic=sweep is True) if sweep else [overrides]:
            compose_explained(lambda o: compose_with(o, config_name=config_name), job)
    except ComposeError as err:
        raise SystemExit(f"rlcore: the config does not compose: {err}") from None


if __name__ == "__main__":
    main()
