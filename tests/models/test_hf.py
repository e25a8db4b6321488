"""rlcore.models.hf's loading options, each as verl's key means it: trust_remote_code, custom_chat_template,
hf_config_path, external_lib."""

import json
import shutil
import sys

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from rlcore.config import compose
from rlcore.engine.factory import engine_spec
from rlcore.models.hf import ModelLoadError, import_external_lib, load_causal_lm, load_config, load_tokenizer, load_value_model, policy_tokenizer

REMOTE_CODE = '''
from transformers import AutoModel, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM, Qwen2ForTokenClassification, Qwen2Model


class RemoteTinyConfig(Qwen2Config):
    model_type = "rlcore_remote_qwen2"


class RemoteTinyModel(Qwen2Model):
    config_class = RemoteTinyConfig


AutoModel.register(RemoteTinyConfig, RemoteTinyModel)  # the token-classification head builds its trunk through AutoModel


class RemoteTinyForCausalLM(Qwen2ForCausalLM):
    config_class = RemoteTinyConfig


class RemoteTinyForTokenClassification(Qwen2ForTokenClassification):
    config_class = RemoteTinyConfig


class RemoteTinyTokenizer(PreTrainedTokenizerFast):
    pass
'''


def edit_json(path, **changes):
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


@pytest.fixture
def remote_model_dir(tiny_model_dir, tmp_path):
    """The tiny model as a checkpoint whose config, model and tokenizer classes ship as code in the directory."""
    path = tmp_path / "remote"
    shutil.copytree(tiny_model_dir, path)
    (path / "remote_tiny.py").write_text(REMOTE_CODE)
    edit_json(path / "config.json", model_type="rlcore_remote_qwen2", architectures=["RemoteTinyForCausalLM"],
              auto_map={"AutoConfig": "remote_tiny.RemoteTinyConfig", "AutoModelForCausalLM": "remote_tiny.RemoteTinyForCausalLM",
                        "AutoModelForTokenClassification": "remote_tiny.RemoteTinyForTokenClassification"})
    edit_json(path / "tokenizer_config.json", auto_map={"AutoTokenizer": [None, "remote_tiny.RemoteTinyTokenizer"]})
    return str(path)


def test_trust_remote_code_runs_the_directorys_code_only_when_set(remote_model_dir):
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        load_config(remote_model_dir)
    assert type(load_config(remote_model_dir, trust_remote_code=True)).__name__ == "RemoteTinyConfig"
    assert type(load_causal_lm(remote_model_dir, trust_remote_code=True)).__name__ == "RemoteTinyForCausalLM"
    assert type(load_causal_lm(remote_model_dir, trust_remote_code=True, weights=False)).__name__ == "RemoteTinyForCausalLM"
    assert type(load_value_model(remote_model_dir, trust_remote_code=True)).__name__ == "RemoteTinyForTokenClassification"
    # The tokenizer names a class of its own too (tokenizer_class): untrusted, that one loads and the code does not run.
    assert type(load_tokenizer(remote_model_dir)) is PreTrainedTokenizerFast
    assert type(load_tokenizer(remote_model_dir, trust_remote_code=True)).__name__ == "RemoteTinyTokenizer"


def test_each_roles_trust_remote_code_reaches_its_engine(tiny_model_dir, tmp_path):
    cfg = compose(["recipe=tiny_cpu", f"actor_rollout_ref.model.path={tiny_model_dir}", "actor_rollout_ref.model.trust_remote_code=True",
                   f"actor_rollout_ref.model.hf_config_path={tmp_path}", "reward_model.model.trust_remote_code=True"])
    arr, critic, rm = cfg.actor_rollout_ref, cfg.critic, cfg.reward_model
    actor = engine_spec(arr.actor.strategy, arr.model, arr.actor, arr.actor.optim, 1.0, 1)
    assert (actor.trust_remote_code, actor.hf_config_path) == (True, str(tmp_path))
    value = engine_spec(critic.strategy, critic.model, critic, critic.optim, 1.0, 1, kind="value")
    assert (value.trust_remote_code, value.hf_config_path) == (False, None)  # verl 0.9: the critic's own keys
    own = compose(["critic.model.trust_remote_code=True", f"critic.model.hf_config_path={tmp_path}"]).critic
    assert (engine_spec(own.strategy, own.model, own, own.optim, 1.0, 1, kind="value").trust_remote_code,
            engine_spec(own.strategy, own.model, own, own.optim, 1.0, 1, kind="value").hf_config_path) == (True, str(tmp_path))
    reward = engine_spec(rm.strategy, rm.model, rm, None, 0.0, 1, kind="reward")
    assert (reward.trust_remote_code, reward.hf_config_path) == (True, None)
    plain = compose(["recipe=tiny_cpu"]).actor_rollout_ref
    assert engine_spec(plain.actor.strategy, plain.model, plain.actor, plain.actor.optim, 1.0, 1).trust_remote_code is False


def test_custom_chat_template_replaces_the_tokenizers(tiny_model_dir):
    cfg = compose(["recipe=tiny_cpu", f"actor_rollout_ref.model.path={tiny_model_dir}",
                   "actor_rollout_ref.model.custom_chat_template='{% for m in messages %}[{{ m.content }}]{% endfor %}'"])
    messages = [{"role": "user", "content": "1+2="}]
    tok = policy_tokenizer(cfg.actor_rollout_ref.model, trust_remote_code=False)
    assert tok.apply_chat_template(messages, tokenize=False) == "[1+2=]"
    assert tok.apply_chat_template(messages, tokenize=True, return_dict=False) == tok.encode("[1+2=]", add_special_tokens=False)
    assert load_tokenizer(tiny_model_dir).apply_chat_template(messages, tokenize=False) == "<|user|>1+2="


def test_hf_config_path_gives_the_architecture_and_path_the_weights(tiny_model_dir, tmp_path):
    shutil.copy(f"{tiny_model_dir}/config.json", tmp_path / "config.json")
    edit_json(tmp_path / "config.json", max_position_embeddings=128, rms_norm_eps=1e-3)
    model = load_causal_lm(tiny_model_dir, hf_config_path=str(tmp_path))
    assert (model.config.max_position_embeddings, model.config.rms_norm_eps) == (128, 1e-3)
    base = load_causal_lm(tiny_model_dir)
    assert base.config.max_position_embeddings == 64
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), base.state_dict().values()))
    with pytest.raises(FileNotFoundError, match="actor_rollout_ref.model.hf_config_path="):
        load_config(tiny_model_dir, hf_config_path=str(tmp_path / "missing"))

    from rlcore.rollout.native import NativeRollout

    rollout = NativeRollout(tiny_model_dir, pad_token_id=0, device=torch.device("cpu"), hf_config_path=str(tmp_path))
    assert rollout.model.config.max_position_embeddings == 128


EXTERNAL_LIB = '''
from transformers import AutoConfig, AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM


class ExtConfig(Qwen2Config):
    model_type = "rlcore_ext_qwen2"


class ExtForCausalLM(Qwen2ForCausalLM):
    config_class = ExtConfig


AutoConfig.register("rlcore_ext_qwen2", ExtConfig)
AutoModelForCausalLM.register(ExtConfig, ExtForCausalLM)
'''


def test_external_lib_registers_an_architecture_before_loading(tiny_model_dir, tmp_path, monkeypatch):
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model_dir)
    edit_json(model_dir / "config.json", model_type="rlcore_ext_qwen2", architectures=["ExtForCausalLM"])
    (tmp_path / "rlcore_ext_arch.py").write_text(EXTERNAL_LIB)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "rlcore_ext_arch", raising=False)
    with pytest.raises(ValueError, match="rlcore_ext_qwen2"):
        load_config(str(model_dir))
    import_external_lib("rlcore_ext_arch", "actor_rollout_ref.model.external_lib")
    assert type(load_causal_lm(str(model_dir))).__name__ == "ExtForCausalLM"
    import_external_lib(None, "actor_rollout_ref.model.external_lib")  # unset: nothing to import
    with pytest.raises(ModelLoadError, match=r"critic.model.external_lib=no_such_module_xyz: the module does not import"):
        import_external_lib("no_such_module_xyz", "critic.model.external_lib")


def test_the_log_prob_head_reads_the_models_logit_scale_and_refuses_what_it_cannot_reproduce(tiny_model_dir):
    """A forward that scales its head's output (Cohere's logit_scale, Granite's 1 / logits_scaling) is calibrated to
    that scale, exactly the config value; one that bends it otherwise (here: squared) is refused."""
    from rlcore.models.hf import TokenHead

    model = load_causal_lm(tiny_model_dir).eval()
    forward = model.forward

    def scaled(*args, **kwargs):
        out = forward(*args, **kwargs)
        out.logits = out.logits * 0.25
        return out

    head = TokenHead(model)
    model.config.logit_scale = 0.25
    model.forward = scaled
    head.calibrate(model, torch.device("cpu"))
    assert head.scale == 0.25

    def squared(*args, **kwargs):
        out = forward(*args, **kwargs)
        out.logits = out.logits ** 2
        return out

    model.forward = squared
    with pytest.raises(ValueError, match="in a way rlcore's log-prob head cannot reproduce"):
        TokenHead(model).calibrate(model, torch.device("cpu"))
