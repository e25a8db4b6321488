"""rlcore.trainer.setup.build_data: the controller's tokenizer and prompt loaders follow the data and model keys."""

import sys

import numpy as np
import pytest

from rlcore.config import ConfigError, compose
from rlcore.trainer.setup import build_data


def tiny(tiny_model_dir, tiny_task_dir, *extra):
    return compose(["recipe=tiny_cpu", f"actor_rollout_ref.model.path={tiny_model_dir}", f"data.train_files={tiny_task_dir}/train.parquet",
                    f"data.val_files={tiny_task_dir}/test.parquet", "data.shuffle=False", *extra])


def test_custom_chat_template_and_its_kwargs_make_the_prompt_ids(tiny_model_dir, tiny_task_dir):
    template = "'{% for m in messages %}[{{ m.content }}]{% endfor %}{% if mark %}>{% endif %}'"
    plain_tok, plain, _ = build_data(tiny(tiny_model_dir, tiny_task_dir))
    tok, train, _ = build_data(tiny(tiny_model_dir, tiny_task_dir, f"actor_rollout_ref.model.custom_chat_template={template}",
                                    "+data.apply_chat_template_kwargs.mark=True", "data.max_prompt_length=16"))
    messages = train.dataset.rows[0]["prompt"]
    assert train.dataset.prompt_ids[0] == tok.encode(f"[{messages[0]['content']}]>", add_special_tokens=False)
    assert plain.dataset.prompt_ids[0] == plain_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)


def test_validation_shuffle_is_seeded(tiny_model_dir, tiny_task_dir):
    def val_order(*extra):
        val = build_data(tiny(tiny_model_dir, tiny_task_dir, "data.val_batch_size=4", *extra))[2]
        return np.concatenate([batch["index"] for batch in val])

    plain = val_order()
    assert plain.tolist() == sorted(plain.tolist())  # the file's order
    shuffled = val_order("data.validation_shuffle=True", "data.seed=3")
    assert sorted(shuffled.tolist()) == plain.tolist() and shuffled.tolist() != plain.tolist()
    assert val_order("data.validation_shuffle=True", "data.seed=3").tolist() == shuffled.tolist()
    assert val_order("data.validation_shuffle=True", "data.seed=4").tolist() != shuffled.tolist()


def test_external_lib_is_imported_in_the_controller(tiny_model_dir, tiny_task_dir, tmp_path, monkeypatch):
    (tmp_path / "rlcore_ext_probe.py").write_text("IMPORTED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "rlcore_ext_probe", raising=False)
    build_data(tiny(tiny_model_dir, tiny_task_dir, "actor_rollout_ref.model.external_lib=rlcore_ext_probe"))
    assert sys.modules["rlcore_ext_probe"].IMPORTED
    with pytest.raises(ConfigError, match="actor_rollout_ref.model.external_lib=no_such_module_xyz: the module does not import"):
        build_data(tiny(tiny_model_dir, tiny_task_dir, "actor_rollout_ref.model.external_lib=no_such_module_xyz"))


def test_train_max_samples_caps_the_training_prompts(tiny_model_dir, tiny_task_dir):
    full = build_data(tiny(tiny_model_dir, tiny_task_dir, "data.train_batch_size=4"))[1]
    capped = build_data(tiny(tiny_model_dir, tiny_task_dir, "data.train_batch_size=4", "data.train_max_samples=5"))[1]
    assert len(capped.dataset) == 5 < len(full.dataset)
    assert capped.dataset.prompt_ids == full.dataset.prompt_ids[:5]


def test_val_batch_size_sets_the_validation_batches(tiny_model_dir, tiny_task_dir):
    def sizes(*extra):
        return [len(batch["index"]) for batch in build_data(tiny(tiny_model_dir, tiny_task_dir, *extra))[2]]

    whole = sizes("data.val_batch_size=null")
    assert len(whole) == 1  # null: the whole validation set in one batch
    assert sizes("data.val_batch_size=4")[:-1] == [4] * (len(sizes("data.val_batch_size=4")) - 1) and sum(sizes("data.val_batch_size=4")) == whole[0]


BY_SOURCE = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 0.0

def by_source(data_source, solution_str, ground_truth, extra_info=None):
    return {"easy": 1.0, "hard": 2.0}[data_source]
"""


def test_reward_fn_key_and_custom_reward_function_name_pick_the_column_and_the_scorer(tmp_path):
    import torch

    from rlcore.data.tokenizer import build_char_tokenizer
    from rlcore.protocol import DataProto
    from rlcore.trainer.setup import build_reward_fns

    path = tmp_path / "reward.py"
    path.write_text(BY_SOURCE)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    batch = DataProto.from_dict({"responses": torch.full((2, 3), 7) * mask, "response_mask": mask, "attention_mask": mask},
                                {"data_source": np.array(["other", "other"], dtype=object), "task": np.array(["easy", "hard"], dtype=object),
                                 "reward_model": np.array([{"ground_truth": "x"}] * 2, dtype=object)})

    def scores(*extra):
        cfg = compose(["recipe=tiny_cpu", f"reward.custom_reward_function.path={path}", "reward_model.score_workers=0", *extra])
        reward_fn, _ = build_reward_fns(cfg, build_char_tokenizer())
        try:
            return reward_fn(batch)[0]
        finally:
            reward_fn.close()

    by_task = scores("reward.custom_reward_function.name=by_source", "data.reward_fn_key=task")
    assert by_task.tolist() == [[0.0, 1.0, 0.0], [2.0, 0.0, 0.0]]  # each row's "task" column, scored by by_source, on its last token
    assert scores("data.reward_fn_key=task").sum().item() == 0.0  # the default name: compute_score
    with pytest.raises(RuntimeError, match="KeyError: 'other'"):  # the default key: the data_source column, which by_source does not know
        scores("reward.custom_reward_function.name=by_source", "reward_model.max_error_rate=0.0")
