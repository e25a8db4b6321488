"""Vision-language models on the FSDP2 engine (rlcore.models.vision), tiny random Qwen2.5-VL and Qwen3-VL with
their processors: the training forward's response log-probs equal HF's own forward of each row alone (its own
multimodal positions), padded, packed and cut into micro-batches, with rows of zero, one and two images of different
sizes; packed gradients equal padded ones; a frozen tower gets no gradients. The two-rank case (a rank with no image
keeps the tower's collectives in step) is tests/models/test_vision_dist.py."""

import io

import numpy as np
import pytest
import torch
from dist_utils import close_gloo, free_port, init_gloo
from PIL import Image
from transformers import AutoConfig, AutoModelForImageTextToText

from rlcore.data.multimodal import process_row
from rlcore.data.tokenizer import build_char_tokenizer
from rlcore.engine.base import EngineSpec, TokenRequest
from rlcore.families.vision import TINY_VISION, placeholder_token_ids
from rlcore.models.logits import gather_log_probs
from rlcore.models.vision import MULTI_MODAL_INPUTS, build_vl_model_dir, load_processor
from rlcore.protocol import DataProto, position_ids_from_mask

pytestmark = pytest.mark.numerics
RESPONSE = 4
# (prompt text, image sizes (w, h) in pixels): no image, one, one of another size, two
PROMPTS = [("how many?", []), ("<image>count", [(56, 28)]), ("<image> and", [(28, 56)]), ("<image><image>same?", [(28, 28), (56, 56)])]


def image(width: int, height: int, seed: int) -> dict:
    pixels = (np.random.RandomState(seed).rand(height, width, 3) * 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return {"bytes": buffer.getvalue()}  # verl's image cell


@pytest.fixture(scope="module", params=sorted(TINY_VISION))
def vl(request, tmp_path_factory):
    """(model dir, processor, a batch in the trainer's layout: left-padded prompts, right-padded responses)."""
    model_dir = build_vl_model_dir(str(tmp_path_factory.mktemp("vl") / request.param), request.param, build_char_tokenizer())
    processor = load_processor(model_dir)
    rows = [process_row(processor, [{"role": "user", "content": text}], [image(w, h, i) for i, (w, h) in enumerate(sizes)])
            for text, sizes in PROMPTS]
    width = max(len(ids) for ids, _, _ in rows)
    g = torch.Generator().manual_seed(0)
    prompt = torch.zeros(len(rows), width, dtype=torch.long)
    prompt_mask = torch.zeros_like(prompt)
    for i, (ids, _, _) in enumerate(rows):
        prompt[i, width - len(ids):], prompt_mask[i, width - len(ids):] = torch.tensor(ids), 1
    response_mask = torch.ones(len(rows), RESPONSE, dtype=torch.long)
    response_mask[1, 2:] = 0
    responses = torch.randint(6, 102, (len(rows), RESPONSE), generator=g) * response_mask
    mask = torch.cat([prompt_mask, response_mask], -1)
    batch = DataProto.from_dict({"input_ids": torch.cat([prompt, responses], -1), "attention_mask": mask,
                                 "position_ids": position_ids_from_mask(mask), "responses": responses, "response_mask": response_mask})
    column = np.empty(len(rows), dtype=object)
    for i, (_, inputs, _) in enumerate(rows):
        column[i] = inputs
    batch.non_tensor_batch[MULTI_MODAL_INPUTS] = column
    return model_dir, processor, batch


def hf_alone(model_dir: str, batch: DataProto) -> torch.Tensor:
    """HF's own forward of each row alone, its positions computed by the model from the processor's token types;
    the image / video placeholders out of the softmax (the rollout never samples them)."""
    hf = AutoModelForImageTextToText.from_pretrained(model_dir, local_files_only=True)
    image_token = hf.config.image_token_id
    out = torch.zeros(batch.batch["responses"].shape)
    for row in range(len(batch)):
        mask = batch.batch["attention_mask"][row].bool()
        ids = batch.batch["input_ids"][row][mask][None]
        n = int(batch.batch["response_mask"][row].sum())
        with torch.no_grad():
            logits = hf(input_ids=ids, mm_token_type_ids=(ids == image_token).int(), use_cache=False,
                        **batch.non_tensor_batch[MULTI_MODAL_INPUTS][row]).logits[0]
        logits[:, list(placeholder_token_ids(hf.config))] = float("-inf")  # out of the policy: never sampled
        first = ids.shape[1] - n
        out[row, :n] = gather_log_probs(logits[first - 1: first - 1 + n], batch.batch["responses"][row, :n])
    return out


def test_training_log_probs_equal_hfs_own_forward_padded_packed_and_in_micro_batches(vl):
    from rlcore.engine.fsdp2 import FSDP2Engine

    model_dir, _, batch = vl
    expected, valid = hf_alone(model_dir, batch), batch.batch["response_mask"].bool()
    init_gloo(0, 1, free_port())
    try:
        grads = {}
        for packed in (False, True):
            engine = FSDP2Engine(EngineSpec(model_path=model_dir, use_remove_padding=packed), torch.device("cpu"))
            for micro in ([batch], batch.chunk(2)):  # one micro-batch, or two (the second has the two-image row)
                parts = engine.forward(micro, lambda out, mb: {"lp": out["log_probs"]}, TokenRequest())
                log_probs = torch.cat([p["lp"] for p in parts])
                print(f"{model_dir.rsplit('/', 1)[-1]} {'packed' if packed else 'padded'} x{len(micro)}: log-probs "
                      f"{float((log_probs[valid] - expected[valid]).abs().max()):.1e} off HF's")
                torch.testing.assert_close(log_probs[valid], expected[valid], atol=1e-5, rtol=1e-5, msg=f"packed={packed} {len(micro)}")
            engine.forward_backward([batch], lambda out, mb: ((out["log_probs"] * mb.batch["response_mask"]).sum(), {}), TokenRequest())
            grads[packed] = {n: p.grad.full_tensor() for n, p in engine.model.named_parameters()}
        assert any(n.startswith("model.visual") and g.abs().sum() > 0 for n, g in grads[True].items())
        print(f"packed gradients off padded: {max(float((g - grads[False][n]).abs().max()) for n, g in grads[True].items()):.1e}")
        for name, grad in grads[True].items():
            torch.testing.assert_close(grad, grads[False][name], atol=2e-5, rtol=1e-4, msg=name)
    finally:
        close_gloo()


def test_a_frozen_tower_gets_no_gradients_and_no_optimizer_state(vl):
    """actor_rollout_ref.actor.freeze_vision_tower=True through the engine's spec, as the actor builds it."""
    from omegaconf import OmegaConf

    from rlcore.config.actor_schema import ActorConfig
    from rlcore.config.schema import ModelConfig
    from rlcore.engine.factory import engine_spec
    from rlcore.engine.fsdp2 import FSDP2Engine

    model_dir, processor, batch = vl
    vision_ids = processor.tokenizer.convert_tokens_to_ids(["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"])
    assert placeholder_token_ids(AutoConfig.from_pretrained(model_dir)) == tuple(sorted(vision_ids))
    assert placeholder_token_ids({"model_type": "qwen2", "image_token_id": 5}) == ()  # text-only: nothing held back
    actor = OmegaConf.structured(ActorConfig(freeze_vision_tower=True))
    spec = engine_spec("fsdp2", OmegaConf.structured(ModelConfig(path=model_dir, use_remove_padding=True)), actor, actor.optim, 1.0, 2)
    init_gloo(0, 1, free_port())
    try:
        engine = FSDP2Engine(spec, torch.device("cpu"))
        trained = {id(p) for p in engine.trained}
        tower = [p for n, p in engine.model.named_parameters() if n.startswith("model.visual")]
        assert tower and not any(id(p) in trained for p in tower)
        engine.forward_backward([batch], lambda out, mb: ((out["log_probs"] * mb.batch["response_mask"]).sum(), {}), TokenRequest())
        assert all(p.grad is None for p in tower)
        assert all(p.grad is not None for p in engine.trained)
        # the weight sync after the first: the tower is neither gathered nor sent, everything else is
        every, trainable = dict(engine.rollout_weights()), dict(engine.rollout_weights(trainable_only=True))
        assert set(every) - set(trainable) == {n for n in every if n.startswith("model.visual")} != set()
        # a caller that drops the images: refused, not embedded as plain tokens
        with pytest.raises(ValueError, match="image tokens but no multi_modal_inputs"):
            engine.forward([DataProto(batch.batch, {}, {})], lambda out, mb: {}, TokenRequest())
    finally:
        close_gloo()


def _two_ranks(rank, port, model_dir, batch, out_path):
    """Two layouts over 2 gloo ranks. Data parallel: rank 0 trains on the rows with images, rank 1 on the text-only
    row (without the tower anchor rank 1 skips the tower's collectives and gloo fails on the mismatch; a hang on
    NCCL). Ulysses (sp=2): both ranks hold the whole micro-batch, each half of its packed tokens."""
    from rlcore.engine.fsdp2 import FSDP2Engine

    def loss(out, mb):
        return (out["log_probs"] * mb.batch["response_mask"]).sum(), {}

    init_gloo(rank, 2, port)
    engine = FSDP2Engine(EngineSpec(model_path=model_dir, use_remove_padding=True), torch.device("cpu"))
    engine.forward_backward([batch.index([1, 2, 3] if rank == 0 else [0])], loss, TokenRequest())
    data_parallel = {n: 2 * p.grad.full_tensor() for n, p in engine.model.named_parameters()}  # FSDP2 averages the 2 ranks
    del engine
    engine = FSDP2Engine(EngineSpec(model_path=model_dir, use_remove_padding=True, ulysses_sp=2), torch.device("cpu"))
    log_probs = engine.forward([batch], lambda out, mb: {"log_probs": out["log_probs"]}, TokenRequest())[0]["log_probs"]
    engine.forward_backward([batch], loss, TokenRequest())
    ulysses = {n: p.grad.full_tensor() for n, p in engine.model.named_parameters()}
    if rank == 0:
        torch.save((data_parallel, log_probs, ulysses), out_path)
    close_gloo()


def test_two_ranks_equal_one_process_with_a_rank_without_an_image_and_under_ulysses(vl, tmp_path):
    """Data parallel with one rank's micro-batch holding no image, and Ulysses sequence parallelism (sp=2: each
    rank runs the tower on every image and keeps the features of the image tokens in its half of the packed row,
    which parts inside an image's tokens): gradients equal one process's (FSDP averages the sp ranks' shares as it
    does for text), Ulysses' log-probs HF's forward of each row alone."""
    from dist_utils import spawn_ranks

    from rlcore.engine.fsdp2 import FSDP2Engine

    model_dir, processor, batch = vl
    packed = batch.batch["input_ids"][batch.batch["attention_mask"].bool()]  # the packed row, rows one after another
    image_token = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    half = -(-len(packed) // 2)
    assert packed[half - 1] == packed[half] == image_token  # the ranks' slices part inside an image's tokens
    spawn_ranks(_two_ranks, 2, lambda port: (port, model_dir, batch, tmp_path / "two.pt"))
    data_parallel, log_probs, ulysses = torch.load(tmp_path / "two.pt")
    valid = batch.batch["response_mask"].bool()
    expected = hf_alone(model_dir, batch)
    print(f"Ulysses sp=2: log-probs {float((log_probs[valid] - expected[valid]).abs().max()):.1e} off HF's forward")
    torch.testing.assert_close(log_probs[valid], expected[valid], atol=1e-5, rtol=1e-5)
    init_gloo(0, 1, free_port())
    try:
        engine = FSDP2Engine(EngineSpec(model_path=model_dir, use_remove_padding=True), torch.device("cpu"))
        engine.forward_backward([batch], lambda out, mb: ((out["log_probs"] * mb.batch["response_mask"]).sum(), {}), TokenRequest())
        one = {n: p.grad.full_tensor() for n, p in engine.model.named_parameters()}
    finally:
        close_gloo()
    for label, grads in (("2 ranks, one without an image", data_parallel), ("Ulysses sp=2", ulysses)):
        print(f"{label}: gradients {max(float((grads[n] - g).abs().max()) for n, g in one.items()):.1e} off 1 process")
        for name, grad in one.items():
            torch.testing.assert_close(grads[name], grad, atol=2e-5, rtol=1e-4, msg=f"{label}: {name}")
