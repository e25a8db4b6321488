"""verl's multimodal rows through RLHFDataset with a vision-language processor (rlcore.data.multimodal): each
`<image>` becomes as many image tokens as the image's merged patches, the row carries the processor's tensors and
its images, and bad rows are reported all at once with what to fix."""

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from rlcore.data.dataset import RLHFDataset
from rlcore.data.multimodal import decode_image, image_messages
from rlcore.data.tokenizer import build_char_tokenizer
from rlcore.models.vision import MULTI_MODAL_INPUTS, build_vl_model_dir, load_processor


def png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray((np.random.RandomState(0).rand(height, width, 3) * 255).astype(np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def processor(tmp_path_factory):
    return load_processor(build_vl_model_dir(str(tmp_path_factory.mktemp("vl") / "m"), "tiny-qwen2-5-vl", build_char_tokenizer()))


def write(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def dataset(path, processor, **kwargs):
    args = dict(prompt_key="prompt", max_prompt_length=64, filter_overlong_prompts=False, truncation="error", max_samples=-1,
                return_raw_chat=False, processor=processor)
    return RLHFDataset(path, processor.tokenizer, **{**args, **kwargs})


def test_images_expand_into_their_tokens_and_travel_with_the_row(processor, tmp_path):
    """data.image_key names the column (here not verl's default `images`)."""
    rows = [{"prompt": [{"role": "user", "content": "<image>How many? <image>"}], "pictures": [{"bytes": png(56, 28)}, {"bytes": png(28, 28)}],
             "data_source": "geo3k", "reward_model": {"ground_truth": "2"}},
            {"prompt": [{"role": "user", "content": "no image"}], "pictures": [], "data_source": "geo3k", "reward_model": {"ground_truth": "1"}}]
    data = dataset(write(tmp_path / "rows.parquet", rows), processor, image_key="pictures")
    item = data[0]
    grid = item[MULTI_MODAL_INPUTS]["image_grid_thw"]
    image_token = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert grid.tolist() == [[1, 2, 4], [1, 2, 2]]  # 28 px = 2 patches of 14; merged 2 x 2 -> 2 and 1 tokens
    assert int((item["input_ids"] == image_token).sum()) == int(grid.prod(-1).sum()) // 4
    assert item[MULTI_MODAL_INPUTS]["pixel_values"].shape[0] == int(grid.prod(-1).sum())
    assert [im.size for im in item["multi_modal_data"]["image"]] == [(56, 28), (28, 28)]
    assert MULTI_MODAL_INPUTS in data[1] and not data[1][MULTI_MODAL_INPUTS]


def test_bad_rows_are_named_together_and_long_image_prompts_are_not_cut(processor, tmp_path):
    rows = [{"prompt": [{"role": "user", "content": "<image><image>two?"}], "images": [{"bytes": png(28, 28)}], "clips": []},
            {"prompt": [{"role": "user", "content": "<image>broken"}], "images": [{"bytes": b"not a png"}]},
            {"prompt": [{"role": "user", "content": "<image>fine"}], "images": [{"bytes": png(28, 28)}]},
            {"prompt": [{"role": "user", "content": "a clip"}], "images": [], "clips": ["a.mp4"]}]
    with pytest.raises(ValueError) as err:  # data.video_key names the videos column
        dataset(write(tmp_path / "bad.parquet", rows), processor, video_key="clips")
    assert "2 <image> placeholder(s) and images holds 1 image(s)" in str(err.value) and "does not decode" in str(err.value)
    assert "the row has videos in clips" in str(err.value)
    long = [{"prompt": [{"role": "user", "content": "<image>" + "x" * 40}], "images": [{"bytes": png(112, 112)}]}]
    with pytest.raises(ValueError, match="truncating would cut an image's tokens"):
        dataset(write(tmp_path / "long.parquet", long), processor, max_prompt_length=48, truncation="left")


def test_verl_image_cells_decode_and_placeholders_split_the_text(tmp_path):
    path = tmp_path / "a.png"
    path.write_bytes(png(8, 4))
    for cell in ({"bytes": png(8, 4)}, {"path": str(path)}, str(path), Image.open(path)):
        assert decode_image(cell).size == (8, 4)
    assert image_messages([{"role": "user", "content": "a<image>b"}])[0]["content"] == [
        {"type": "text", "text": "a"}, {"type": "image"}, {"type": "text", "text": "b"}]
