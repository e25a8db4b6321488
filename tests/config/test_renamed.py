"""verl 0.8's names of the keys verl 0.9 renamed (rlcore/config/renamed.py): a 0.8 script's value reaches the 0.9 key
the run reads, with a one-line note naming that key; both names set to different values is an error."""

from rlcore.cli.plan import main as plan
from rlcore.config import compose
from rlcore.config.renamed import RENAMED, renamed_errors, renamed_from, renamed_notes
from rlcore.config.validate import diagnose

# 0.8 override -> (0.9 key, the value it must read)
OLD = {
    "critic.model.fsdp_config.param_offload=True": ("critic.fsdp.param_offload", True),
    "critic.model.fsdp_config.wrap_policy.min_num_params=7": ("critic.fsdp.wrap_policy.min_num_params", 7),
    "reward_model.reward_manager=dapo": ("reward.reward_manager.name", "dapo"),
    "+reward_model.reward_kwargs.max_resp_len=64": ("reward.reward_kwargs", {"max_resp_len": 64}),
    "custom_reward_function.path=/my/reward.py": ("reward.custom_reward_function.path", "/my/reward.py"),
    "custom_reward_function.name=my_score": ("reward.custom_reward_function.name", "my_score"),
    "reward_model.enable=True": ("reward.reward_model.enable", True),
    "reward_model.model.path=/my/rm": ("reward.reward_model.model_path", "/my/rm"),
    "reward_model.enable_resource_pool=True": ("reward.reward_model.enable_resource_pool", True),
    "reward_model.n_gpus_per_node=2": ("reward.reward_model.n_gpus_per_node", 2),
    "reward_model.nnodes=1": ("reward.reward_model.nnodes", 1),
    "reward_model.num_workers=3": ("reward.num_workers", 3),
    "reward_model.rollout.gpu_memory_utilization=0.3": ("reward.reward_model.rollout.gpu_memory_utilization", 0.3),
}


def test_every_renamed_key_of_verl_0_8_is_read_as_its_0_9_key_with_a_note():
    from omegaconf import OmegaConf

    cfg = compose(list(OLD))
    for override, (new, value) in OLD.items():
        got = OmegaConf.select(cfg, new)
        assert (OmegaConf.to_container(got) if OmegaConf.is_config(got) else got) == value, override
    notes = renamed_notes(cfg)
    assert len(notes) == len(OLD)
    assert "reward_model.reward_manager=dapo: verl 0.8's name of reward.reward_manager.name, read as that key" in notes
    assert renamed_errors(cfg) == [] and {new.split(".")[0] for new, _ in RENAMED} == {"critic", "reward"}
    assert renamed_from("critic.model.fsdp_config.dtype") == "critic.fsdp.dtype" and renamed_from("critic.fsdp.dtype") is None
    # the 0.9 dialect: no note
    assert renamed_notes(compose(["reward.reward_manager.name=dapo", "critic.fsdp.param_offload=True"])) == []


def test_both_names_with_different_values_are_refused_and_the_plan_names_the_old_ones(capsys):
    # (a 0.9 key set to its default is not told apart from one left alone: the 0.8 value then wins, unrefused)
    cfg = compose(["reward_model.reward_manager=dapo", "reward.reward_manager.name=gdpo"])
    assert cfg.reward.reward_manager.name == "gdpo"  # the 0.9 key is kept; the error says which to keep
    assert [e for e in diagnose(cfg)[1] if "verl 0.8's name" in e] == [
        "reward_model.reward_manager=dapo (verl 0.8's name) and reward.reward_manager.name=gdpo are the same setting with two "
        "values; keep reward.reward_manager.name only"]
    plan(["--elsewhere", "recipe=tiny_cpu", "custom_reward_function.name=my_score"])
    out = capsys.readouterr().out
    assert ("1 key(s) under another of verl's names:\n  - custom_reward_function.name=my_score: verl 0.8's name of "
            "reward.custom_reward_function.name, read as that key") in out


def test_the_megatron_engines_router_replay_is_the_roles():
    # verl 0.9's engine workers read actor.megatron.router_replay.mode (its router-replay example sets it); rlcore reads
    # actor.router_replay.mode, and the reference follows the actor's
    cfg = compose(["recipe=tiny_cpu", "actor_rollout_ref.actor.megatron.router_replay.mode=R2"])
    assert (cfg.actor_rollout_ref.actor.router_replay.mode, cfg.actor_rollout_ref.ref.router_replay.mode) == ("R2", "R2")
    assert renamed_notes(cfg) == ["actor_rollout_ref.actor.megatron.router_replay.mode=R2: verl 0.9's Megatron-engine copy of "
                                  "actor_rollout_ref.actor.router_replay.mode, read as that key"]
    cfg = compose(["recipe=tiny_cpu", "actor_rollout_ref.actor.megatron.router_replay.mode=R2", "actor_rollout_ref.actor.router_replay.mode=R3"])
    assert "keep actor_rollout_ref.actor.router_replay.mode only" in renamed_errors(cfg)[0]
