"""rlcore.data.geo3k writes verl's Geometry3K rows from a local copy of the dataset; the dataset reads them with a
vision-language processor (each diagram's <image> expanded) and the geo3k scorer grades them."""

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from rlcore.data import geo3k
from rlcore.data.dataset import RLHFDataset
from rlcore.data.tokenizer import build_char_tokenizer
from rlcore.models.vision import MULTI_MODAL_INPUTS, build_vl_model_dir, load_processor
from rlcore.reward.scorers import default_compute_score


def diagram() -> dict:
    buffer = io.BytesIO()
    Image.fromarray((np.random.RandomState(0).rand(28, 42, 3) * 255).astype(np.uint8)).save(buffer, format="PNG")
    return {"bytes": buffer.getvalue(), "path": None}


def test_rows_are_verls_read_with_their_diagrams_and_graded(tmp_path):
    raw = tmp_path / "raw" / "data"
    raw.mkdir(parents=True)
    for split, n in (("train", 3), ("test", 2)):
        records = [{"problem": f"<image>Find x. ({i})", "answer": str(10 + i), "images": [diagram()]} for i in range(n)]
        pq.write_table(pa.Table.from_pylist(records), raw / f"{split}-00000-of-00001.parquet")
    assert geo3k.prepare(str(tmp_path / "raw"), str(tmp_path / "out")) == {"train": 3, "test": 2}
    row = pq.read_table(tmp_path / "out" / "train.parquet").to_pylist()[1]
    assert row["data_source"] == "hiyouga/geometry3k" and row["reward_model"]["ground_truth"] == "11"
    assert row["prompt"][0]["content"].startswith("<image>Find x. (1) You FIRST think")
    processor = load_processor(build_vl_model_dir(str(tmp_path / "vl"), "tiny-qwen2-5-vl", build_char_tokenizer()))
    data = RLHFDataset(str(tmp_path / "out" / "train.parquet"), processor.tokenizer, prompt_key="prompt", max_prompt_length=300,
                       filter_overlong_prompts=False, truncation="error", max_samples=-1, return_raw_chat=False, processor=processor)
    assert data[1][MULTI_MODAL_INPUTS]["image_grid_thw"].tolist() == [[1, 2, 4]]  # 42 x 28 px, resized to 56 x 28: 14-px patches
    assert default_compute_score(row["data_source"], "<think>x</think> \\boxed{11}", row["reward_model"]["ground_truth"]) == 1.0


def test_a_missing_copy_says_how_to_download_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="hf download hiyouga/geometry3k"):
        geo3k.prepare(str(tmp_path), str(tmp_path / "out"))
