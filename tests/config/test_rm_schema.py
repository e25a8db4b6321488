"""Reward-model training configs: every shipped one composes and passes its rules; the rules name the fix."""

import pytest
from omegaconf import OmegaConf

from rlcore.config.rm_schema import rm_config_errors
from rlcore.train_rm import compose_rm


@pytest.mark.parametrize("name", ["rm_trainer", "rm_tiny_cpu", "rm_tiny_cpu_round2", "rm_llama3_8b_lora"])
def test_shipped_rm_configs_compose_and_validate(name):
    cfg = compose_rm(config_name=name)
    assert rm_config_errors(cfg) == []
    assert cfg.data.prompt_key == "prompt" and cfg.model.strategy == "fsdp2"


def test_round_two_continues_from_round_one():
    one, two = compose_rm(config_name="rm_tiny_cpu"), compose_rm(config_name="rm_tiny_cpu_round2")
    assert two.model.path == one.trainer.export_dir and two.trainer.export_dir == one.trainer.export_dir
    assert two.trainer.default_local_dir != one.trainer.default_local_dir


def test_batch_rules():
    cfg = compose_rm(["trainer.n_gpus_per_node=4", "data.train_batch_size=64", "data.micro_batch_size_per_gpu=5",
                      "data.use_dynamic_bsz=False"])
    assert rm_config_errors(cfg) == ["data.micro_batch_size_per_gpu=5 pairs does not divide the 16 pairs per data-parallel rank per step; use a "
                                     "divisor, or data.use_dynamic_bsz=True"]
    cfg = compose_rm(["data.use_dynamic_bsz=True", "data.max_token_len_per_gpu=100", "data.max_length=64", "model.lora_rank=-1"])
    assert rm_config_errors(cfg) == ["data.max_token_len_per_gpu=100 cannot hold one pair of data.max_length=64 tokens; use "
                                     "data.max_token_len_per_gpu=128",
                                     "model.lora_rank=-1 / lora_alpha=16: rank must be >= 0 and alpha > 0"]


def test_the_demo_sft_config_composes_and_validates():
    from rlcore.train_sft import compose_sft, sft_config_errors

    cfg = compose_sft(config_name="sft_tiny_cpu")
    assert sft_config_errors(cfg) == [] and cfg.trainer.stop_metric == "val/exact_match" and cfg.data.val_files


def test_sft_config_has_verls_keys_and_the_shared_rules():
    from rlcore.train_sft import compose_sft, sft_config_errors

    cfg = compose_sft(["model.partial_pretrain=/models/x"])
    assert sft_config_errors(cfg) == [] and cfg.model.path == "/models/x" and cfg.model.use_remove_padding
    for key in ("data.prompt_key", "data.response_key", "data.max_length", "data.truncation", "data.micro_batch_size_per_gpu",
                "model.lora_rank", "model.lora_alpha", "model.target_modules", "optim.lr", "trainer.total_epochs"):
        OmegaConf.select(cfg, key, throw_on_missing=True)
    bad = compose_sft(["data.truncation=middle", "data.train_batch_size=6", "trainer.n_gpus_per_node=4"])
    # with Ulysses 2 the 4 ranks are 2 data-parallel replicas: 6 samples split, 3 each
    assert sft_config_errors(compose_sft(["data.train_batch_size=6", "trainer.n_gpus_per_node=4", "ulysses_sequence_parallel_size=2",
                                          "data.micro_batch_size_per_gpu=3"])) == []
    assert sft_config_errors(bad) == [
        "data.train_batch_size=6 samples is not divisible by 4 data-parallel ranks (trainer.nnodes x trainer.n_gpus_per_node / "
        "Ulysses size): each rank takes whole samples; use data.train_batch_size=4",
        "data.truncation=middle is not one of error, left, right; use data.truncation=error"]


def test_the_sft_and_rm_trainers_refuse_a_key_their_schema_does_not_have():
    from rlcore.train_sft import compose_sft, sft_config_errors

    errors = sft_config_errors(compose_sft(["+data.bogus_key=1"]))
    assert errors[0].startswith("data.bogus_key is not a config key")
    assert rm_config_errors(compose_rm(["+model.bogus=1"]))[0].startswith("model.bogus is not a config key")
