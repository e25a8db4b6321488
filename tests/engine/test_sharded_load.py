"""No rank holds the whole model while loading: on 2 gloo ranks each rank's peak host-memory growth while the FSDP2
engine loads a ~60M-parameter Qwen2 is about its half of the fp32 model, against the whole model (and more) when it
loads the checkpoint first and shards it after; the loaded weights equal the checkpoint's exactly in both
(bench/load_memory.py measures it; `python bench/load_memory.py` does the same at the Qwen2.5-0.5B shape). The
Megatron engine at TP2: each rank reads only its TP pieces, one at a time."""

import importlib
import re
import sys
from pathlib import Path

import pytest
import torch

from rlcore.engine.sharded_load import read_header, read_rows, safetensors_files

BENCH = Path(__file__).resolve().parents[2] / "bench"
BOUND = 0.6  # of the full fp32 model, per rank, at 2 ranks (the shard alone is 0.5)
LORA_BOUND = 0.7  # plus the adapters, drawn whole, and peft's wrapping: measured 0.60 here (51M), 0.53 at 0.5B; 1.21 whole


def load_memory(capsys, *argv: str) -> tuple[int, str]:
    """`python bench/load_memory.py *argv`, run in this process (its ranks are spawned processes either way, and
    they measure the memory): its exit code and what it printed."""
    if str(BENCH) not in sys.path:
        sys.path.append(str(BENCH))
    code = importlib.import_module("load_memory").main(list(argv))
    return code, capsys.readouterr().out


@pytest.mark.parametrize("kind", ["causal_lm", "lora", "moe"])
def test_each_rank_materialises_only_its_shard(kind, capsys):
    """LoRA too: its base is read by HF name into a peft model built on meta, its adapters drawn (B zero, so the
    merged weights are the checkpoint's exactly). A mixture of experts: each rank reads its experts from the
    checkpoint's per-expert tensors into its rows of the fused expert weights."""
    args = ("--shape", "small-moe") if kind == "moe" else ("--shape", "small", "--kind", kind)
    code, out = load_memory(capsys, *args)
    assert code == 0, out  # non-zero: a loaded weight differs from the checkpoint
    sharded, whole = map(float, re.search(r"growth fractions: sharded ([\d.]+) whole ([\d.]+)", out).groups())
    assert sharded <= (LORA_BOUND if kind == "lora" else BOUND) < 1.0 <= whole, out


def test_rows_are_read_in_place_or_converted(tmp_path):
    from safetensors.torch import save_file

    tensors = {"a": torch.arange(24.0).reshape(6, 4), "b": torch.arange(10, dtype=torch.bfloat16)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    assert safetensors_files(str(tmp_path)) == {name: str(tmp_path / "model.safetensors") for name in tensors}
    with open(tmp_path / "model.safetensors", "rb") as f:
        start, header = read_header(f)
        rows = torch.empty(2, 4)
        read_rows(f, start, header["a"], 3, rows)  # in place: same dtype, contiguous
        assert torch.equal(rows, tensors["a"][3:5])
        rows.untyped_storage().resize_(0)  # still resizable, as Megatron's offload needs (numpy's export pinned it)
        upcast = torch.empty(4, dtype=torch.float32)
        read_rows(f, start, header["b"], 6, upcast)  # through a buffer: bf16 on disk, fp32 in the model
        assert torch.equal(upcast, tensors["b"][6:].float())
        with pytest.raises(EOFError):
            read_rows(f, start, header["b"], 8, torch.empty(4, dtype=torch.bfloat16))  # past the end of the file


MEGATRON_BOUND = 0.65  # of the fp32 model per rank at TP2: measured 0.52-0.56 at the 0.5B shape, 0.55 at the small one (the
# rank's half + one column-split piece); 0.66-0.79 while megatron-core's CPU init drew each weight whole first, 1.35 while the
# checkpoint stayed mapped


def test_a_megatron_tp_rank_reads_only_its_pieces(capsys):
    pytest.importorskip("megatron.core")
    code, out = load_memory(capsys, "--backend", "megatron", "--shape", "small")
    assert code == 0, out  # non-zero: a loaded weight differs from the checkpoint
    fraction = float(re.search(r"= ([\d.]+) of the fp32 model", out).group(1))
    assert fraction <= MEGATRON_BOUND, out


def _value_rank(rank, port, model_dir, out):
    """A value model (critic) on 2 FSDP2 ranks, built on meta from `model_dir`: its gathered weights, and which load
    path ran (the parameters' storage was never the whole model's)."""
    from dist_utils import close_gloo, init_gloo

    import rlcore.engine.fsdp2 as fsdp2
    from rlcore.engine.base import EngineSpec

    init_gloo(rank, 2, port)
    torch.manual_seed(7)
    loads = []
    whole = fsdp2.load_value_model
    fsdp2.load_value_model = lambda *a, **k: loads.append(k.get("weights", True)) or whole(*a, **k)
    engine = fsdp2.FSDP2Engine(EngineSpec(model_path=model_dir, kind="value", trainable=True), torch.device("cpu"))
    weights = {name: p.full_tensor().detach().clone() for name, p in engine.model.named_parameters()}
    if rank == 0:
        torch.save({"weights": weights, "loads": loads}, out)
    close_gloo()


@pytest.mark.parametrize("checkpoint", ["causal_lm", "reward_model"])
def test_a_value_model_loads_sharded_with_its_head_drawn_or_read(tiny_model_dir, tmp_path, checkpoint):
    """A critic over a causal LM's checkpoint is built on meta like the actor (no rank reads the whole model) and
    draws its one-row head as HF would (normal, std initializer_range); over a reward model's it reads the head.
    The trunk equals the checkpoint's exactly either way."""
    from dist_utils import spawn_ranks
    from safetensors.torch import load_file, save_file

    model_dir = tiny_model_dir
    if checkpoint == "reward_model":  # the causal LM's trunk with a trained-looking head, in a copy of its directory
        import shutil

        model_dir = str(tmp_path / "rm")
        shutil.copytree(tiny_model_dir, model_dir)
        tensors = load_file(f"{model_dir}/model.safetensors")
        tensors["score.weight"] = torch.full((1, tensors["model.norm.weight"].numel()), 0.125)
        save_file(tensors, f"{model_dir}/model.safetensors")
    out = tmp_path / "value.pt"
    spawn_ranks(_value_rank, 2, lambda port: (port, model_dir, str(out)))
    got = torch.load(out)
    checkpoint_tensors = load_file(f"{model_dir}/model.safetensors")
    assert got["loads"] == [False]  # the architecture on meta, then each rank's rows: never the whole model
    trunk = {name: t for name, t in got["weights"].items() if name != "score.weight"}
    assert trunk and all(torch.equal(t, checkpoint_tensors[name]) for name, t in trunk.items())
    head = got["weights"]["score.weight"]
    if checkpoint == "reward_model":
        assert torch.equal(head, checkpoint_tensors["score.weight"])
    else:
        from transformers import AutoConfig

        std = AutoConfig.from_pretrained(model_dir).initializer_range
        assert head.shape == (1, trunk["model.norm.weight"].numel()) and 0.5 * std < float(head.std()) < 1.5 * std


def test_a_value_model_names_what_its_checkpoint_lacks_and_loads_another_naming_whole(tiny_model_dir):
    """Over a causal LM's checkpoint only the value head may be missing (drawn); a missing trunk tensor is left for
    load_shards to name, as for the actor; a checkpoint whose names match nothing goes through HF's own mapping."""
    from rlcore.engine.sharded_load import load_shards, parameters_on_meta, value_head_init
    from rlcore.models.hf import load_value_model

    files = safetensors_files(tiny_model_dir)
    with parameters_on_meta():
        model = load_value_model(tiny_model_dir, weights=False)
    head = value_head_init(model, files)
    assert list(head) == ["score.weight"] and head["score.weight"].shape == model.get_parameter("score.weight").shape
    assert value_head_init(model, {**files, "score.weight": files["model.norm.weight"]}) == {}  # a reward model's
    assert value_head_init(model, {f"transformer.{name}": f for name, f in files.items()}) is None
    broken = {name: f for name, f in files.items() if name != "model.layers.0.mlp.down_proj.weight"}
    model.to_empty(device="cpu")
    with pytest.raises(KeyError, match="model.layers.0.mlp.down_proj.weight"):
        load_shards(model, broken, value_head_init(model, broken))
