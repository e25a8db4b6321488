"""No rank holds the whole model while loading: on 2 gloo ranks each rank's peak host-memory growth while the FSDP2
engine loads a ~60M-parameter Qwen2 is about its half of the fp32 model, against the whole model (and more) when it
loads the checkpoint first and shards it after; the loaded weights equal the checkpoint's exactly in both
(bench/load_memory.py measures it; `python bench/load_memory.py` does the same at the Qwen2.5-0.5B shape). The
Megatron engine at TP2: each rank reads only its TP pieces, one at a time."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlcore.engine.sharded_load import read_header, read_rows, safetensors_files

BENCH = Path(__file__).resolve().parents[2] / "bench" / "load_memory.py"
BOUND = 0.6  # of the full fp32 model, per rank, at 2 ranks (the shard alone is 0.5)


def test_each_rank_materialises_only_its_shard():
    out = subprocess.run([sys.executable, str(BENCH), "--shape", "small"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr  # non-zero: a loaded weight differs from the checkpoint
    sharded, whole = map(float, re.search(r"growth fractions: sharded ([\d.]+) whole ([\d.]+)", out.stdout).groups())
    assert sharded <= BOUND < 1.0 <= whole, out.stdout


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
        upcast = torch.empty(4, dtype=torch.float32)
        read_rows(f, start, header["b"], 6, upcast)  # through a buffer: bf16 on disk, fp32 in the model
        assert torch.equal(upcast, tensors["b"][6:].float())
        with pytest.raises(EOFError):
            read_rows(f, start, header["b"], 8, torch.empty(4, dtype=torch.bfloat16))  # past the end of the file


MEGATRON_BOUND = 0.95  # of the fp32 model per rank at TP2: measured 0.66-0.79 (the rank's half + one piece + megatron's
# own set-up), 1.35 while the checkpoint stayed mapped for the whole load and vocabulary pieces were padded copies


def test_a_megatron_tp_rank_reads_only_its_pieces():
    pytest.importorskip("megatron.core")
    out = subprocess.run([sys.executable, str(BENCH), "--backend", "megatron"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr  # non-zero: a loaded weight differs from the checkpoint
    fraction = float(re.search(r"= ([\d.]+) of the fp32 model", out.stdout).group(1))
    assert fraction <= MEGATRON_BOUND, out.stdout
