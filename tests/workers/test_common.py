"""What every role shares: its run config as the schema's objects, its passes' micro-batches from the run plan
laid over its engine."""

from types import SimpleNamespace

from omegaconf import OmegaConf

from rlcore.data.micro_batches import MicroBatchSpec
from rlcore.engine.base import EngineSpec
from rlcore.plan.micro_plan import MicroBatch
from rlcore.workers.common import RoleWorker


def _engine(sp: int = 1, packed: bool = True):
    return SimpleNamespace(spec=EngineSpec(model_path="m", use_remove_padding=packed, ulysses_sp=sp))


def test_a_planned_pass_laid_over_the_engine():
    # The run plan says rows per rank or a budget per device (tests/plan/test_micro_plan.py); the engine adds
    # its packing and, for a budget, its Ulysses size: each of the sp ranks sharing a micro-batch holds 1/sp of it.
    role = RoleWorker({}, micro={"rows": MicroBatch(rows=8), "tokens": MicroBatch(max_tokens=4096)})
    assert role.micro_batches("rows", _engine(sp=2)) == MicroBatchSpec(rows=8, packed=True)
    assert role.micro_batches("tokens", _engine(packed=False)) == MicroBatchSpec(max_tokens=4096, packed=False)
    assert role.micro_batches("tokens", _engine(sp=4)) == MicroBatchSpec(max_tokens=4 * 4096, packed=True)


def test_a_role_built_without_the_plan_derives_the_same_one():
    from rlcore.config import compose
    from rlcore.plan.micro_plan import ACTOR_LOG_PROB, ACTOR_UPDATE
    from rlcore.plan.run_plan import plan_run

    cfg = compose(["recipe=tiny_cpu", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"])
    role = RoleWorker(OmegaConf.to_container(cfg, resolve=True))
    planned = plan_run(cfg)[0].micro
    assert role.micro_batches(ACTOR_UPDATE, _engine()).rows == planned[ACTOR_UPDATE].rows == 4
    assert role.micro_batches(ACTOR_LOG_PROB, _engine()).rows == planned[ACTOR_LOG_PROB].rows == 128


def test_a_role_holds_the_run_config_as_the_schemas_objects():
    """What the controller sends (the typed config) is kept as is; a dict of the composed config (as tests build
    workers) becomes the same objects, the schema's defaults under what it leaves out."""
    from rlcore.config import compose
    from rlcore.config.schema import PPOConfig
    from rlcore.config.sft_schema import SFTTrainerConfig
    from rlcore.config.typed import typed
    from rlcore.train_sft import compose_sft
    from rlcore.workers.sft_trainer import SFTTrainerWorker

    run = typed(compose(["recipe=tiny_cpu"]), PPOConfig)
    assert RoleWorker(run).config is run
    held = RoleWorker({"actor_rollout_ref": {"actor": {"ppo_epochs": 3}}}).config
    assert isinstance(held, PPOConfig) and held.actor_rollout_ref.actor.ppo_epochs == 3
    assert held.actor_rollout_ref.rollout.n == PPOConfig().actor_rollout_ref.rollout.n
    assert isinstance(SFTTrainerWorker(OmegaConf.to_container(compose_sft([]), resolve=True)).config, SFTTrainerConfig)


def test_shuffle_deals_each_epochs_rows_into_mini_batches_in_an_order_drawn_from_the_seed():
    """<role>.shuffle with <role>.data_loader_seed (verl's shuffled mini-batch loader): every epoch sees every row once,
    in an order that depends on the seed and the epoch only; without shuffle the batch's own order, every epoch."""
    import torch

    from rlcore.protocol import DataProto
    from rlcore.workers.common import run_ppo_updates

    class Recorder:
        dp_size = 1

        def __init__(self):
            self.seen = []

        def forward_backward(self, micro_batches, loss_fn, request):
            self.seen.append(torch.cat([m.batch["row"] for m in micro_batches]).tolist())
            return [{}]

        def optimizer_step(self, skip=False):
            return {"grad_norm": 0.0, "lr": 0.0, "skipped_step": 0.0}

    def order(seed):
        engine = Recorder()
        data = DataProto.from_dict({"row": torch.arange(8), "response_mask": torch.ones(8, 3)})
        run_ppo_updates(engine, data, 2, 4, MicroBatchSpec(rows=4), lambda counts: None, "actor", shuffle_seed=seed)
        return engine.seen

    plain = order(None)
    assert plain == [[0, 1, 2, 3], [4, 5, 6, 7]] * 2
    shuffled = order(42)
    assert shuffled == order(42) and shuffled != order(7)
    assert shuffled[:2] != shuffled[2:]  # a fresh order each epoch
    assert sorted(shuffled[0] + shuffled[1]) == list(range(8)) == sorted(shuffled[2] + shuffled[3])
