"""HF export from a tensor stream: one file, or shards written as they fill, that transformers loads back."""

import json

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from rlcore.models.hf_export import save_safetensors_stream


def test_small_stream_is_one_file_and_large_ones_are_indexed_shards(tmp_path):
    tensors = {f"t{i}": torch.full((4, 8), float(i)) for i in range(5)}  # 128 bytes each
    save_safetensors_stream(str(tmp_path / "one"), tensors.items())
    assert sorted(p.name for p in (tmp_path / "one").iterdir()) == ["model.safetensors"]
    assert all(torch.equal(load_file(tmp_path / "one" / "model.safetensors")[k], v) for k, v in tensors.items())

    save_safetensors_stream(str(tmp_path / "sharded"), tensors.items(), max_shard_bytes=256)  # two tensors per shard
    files = sorted(p.name for p in (tmp_path / "sharded").iterdir())
    assert files == ["model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors",
                     "model.safetensors.index.json"]  # no temporary file left behind
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == 5 * 128
    assert index["weight_map"] == {"t0": files[0], "t1": files[0], "t2": files[1], "t3": files[1], "t4": files[2]}
    for k, v in tensors.items():
        assert torch.equal(load_file(tmp_path / "sharded" / index["weight_map"][k])[k], v)


def test_ranks_that_do_not_write_still_consume_the_stream(tmp_path):
    consumed = []

    def stream():  # a collective stream: every rank must take part in each gather
        for i in range(3):
            consumed.append(i)
            yield f"t{i}", torch.zeros(2)

    save_safetensors_stream(str(tmp_path / "x"), stream(), write=False)
    assert consumed == [0, 1, 2] and not (tmp_path / "x").exists()


def test_a_sharded_model_loads_in_transformers(tiny_model_dir, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, local_files_only=True)
    state = model.state_dict()
    save_safetensors_stream(str(tmp_path), state.items(), max_shard_bytes=64 * 1024)
    model.config.save_pretrained(tmp_path)
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 2
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, local_files_only=True)
    assert all(torch.equal(v, state[k]) for k, v in loaded.state_dict().items())
