"""Training and decoding on a CUDA GPU; skipped where none is present (the CPU rule test keeps the GPU path right
there: test_recurrent_training_mode.py)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from objective_steps import case_id, make_step_trainer
from transformers import BlipForConditionalGeneration

from rlcaption import CaptionProcessor, ShowTellRL
from rlcaption.data import load_shapes
from rlcaption.generation import step_decoding
from rlcaption.generation.blip_decoding import decode_blip
from rlcaption.generation.captioners import captioner_for
from rlcaption.generation.decoding import (
    GeneratedCaptions,
    caption_token_mask,
    evaluation_mode,
    generate_captions,
)
from rlcaption.generation.recurrent_decoding import decode_recurrent
from rlcaption.objectives import spider_pg
from rlcaption.objectives.base import reward_tensor, to_device_without_waiting
from rlcaption.objectives.spider_pg import sample_rollouts
from tiny_captioners import BLIP_IMAGE_SIZE, DECODING_SETTINGS, make_blip, regions_show_tell

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

REPOSITORY = Path(__file__).resolve().parents[2]
WARM_START = REPOSITORY / "checkpoints" / "show-tell-rl-shapes-xe"
REGION_MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0]] * 2)
# every objective with each of its phases, on the model it trains
STEPS = [
    ("xe", {}, "show_tell_attention"),
    ("scst", {"entropy_bonus_weight": 0.01}, "show_tell_attention"),
    ("spider_pg", {"baseline_pretraining_steps": 1, "num_rollouts": 2}, "show_tell"),
    ("sle", {}, "show_tell_attention"),
    ("wtf", {"wtf_variant": "wtf_rl", "discriminator_pretraining_steps": 1}, "show_tell_attention"),
    ("psst", {"psst_mode": "psst", "listener_pretraining_steps": 1}, "speaker_listener"),
    ("psst", {"psst_mode": "reinforce", "listener_pretraining_steps": 1}, "speaker_listener"),
    ("actor_critic", {"value_pretraining_steps": 1}, "policy_value_attention"),
]


def warm_start_inputs(tmp_path) -> tuple[CaptionProcessor, dict[str, torch.Tensor]]:
    """The XE warm start's processor, and the pixels of 32 shapes test images on the GPU."""
    processor = CaptionProcessor.from_pretrained(WARM_START)
    images = load_shapes(num_train=4, num_validation=4, num_test=32, image_size=48, cache_dir=tmp_path)["test"]
    return processor, {"pixel_values": processor(images=images["image"], return_tensors="pt")["pixel_values"].cuda()}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize(("objective", "fields", "kind"), STEPS, ids=[case_id(*step) for step in STEPS])
def test_every_objective_trains_on_the_gpu(
    objective, fields, kind, precision, tiny_processor, tiny_shapes, reward_clip, embedding_model, tmp_path
):
    trainer = make_step_trainer(
        objective, fields, kind, tiny_processor, tiny_shapes, tmp_path, reward_clip, embedding_model,
        use_cpu=False, bf16=precision == "bf16",
    )  # fmt: skip
    before = {name: tensor.detach().clone() for name, tensor in trainer.model.named_parameters()}
    trainer.train()
    assert next(trainer.model.parameters()).device.type == "cuda"
    assert trainer.state.global_step == trainer.args.max_steps
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert losses and all(torch.isfinite(torch.tensor(losses)))
    assert any(not torch.equal(tensor, before[name]) for name, tensor in trainer.model.named_parameters())


def test_a_recipe_trains_saves_and_resumes_on_the_gpu(tmp_path):
    output_dir = tmp_path / "scst"
    arguments = [
        sys.executable, str(REPOSITORY / "examples" / "train_scst.py"), "--model_name_or_path", str(WARM_START),
        "--output_dir", str(output_dir), "--num_train_images", "32", "--num_validation_images", "4",
        "--num_test_images", "8", "--per_device_train_batch_size", "8", "--num_samples_per_image", "2",
        "--max_caption_length", "8", "--save_strategy", "steps", "--save_steps", "1", "--eval_strategy", "no",
    ]  # fmt: skip
    environment = {**os.environ, "HF_DATASETS_CACHE": str(tmp_path / "cache")}
    for max_steps in ("1", "2"):
        result = subprocess.run(
            [*arguments, "--max_steps", max_steps], env=environment, capture_output=True, text=True, timeout=600
        )
        assert result.returncode == 0, result.stderr[-3000:]
    assert f"Resuming from {output_dir / 'checkpoint-1'}" in result.stdout
    assert json.loads((output_dir / "checkpoint-2" / "trainer_state.json").read_text())["global_step"] == 2
    assert (output_dir / "model.safetensors").is_file()


def test_greedy_captions_on_the_gpu_equal_those_on_the_cpu(tmp_path):
    processor = CaptionProcessor.from_pretrained(WARM_START)
    test_images = load_shapes(num_train=4, num_validation=4, num_test=64, image_size=48, cache_dir=tmp_path)["test"][
        "image"
    ]
    pixel_values = processor(images=test_images, return_tensors="pt")["pixel_values"]
    captions = {}
    for device in ("cpu", "cuda"):
        model = ShowTellRL.from_pretrained(WARM_START).to(device)
        inputs = {"pixel_values": pixel_values.to(device)}
        captions[device] = generate_captions(model, processor, inputs, do_sample=False, num_beams=1).texts
    assert captions["cuda"] == captions["cpu"]


def test_the_decoding_loop_samples_on_the_gpu_as_generate_does(tmp_path):
    _, inputs = warm_start_inputs(tmp_path)
    model = ShowTellRL.from_pretrained(WARM_START).cuda()
    captioner = captioner_for(model)
    sequences = []
    for decoding_loop in (True, False):
        torch.manual_seed(0)
        with evaluation_mode(model):
            sequences.append(
                captioner.generate(inputs, DECODING_SETTINGS["pure sampling"], decoding_loop=decoding_loop)
            )
    assert torch.equal(*sequences)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_decoding_graph_draws_what_step_by_step_decoding_draws(tmp_path, precision):
    _, warm_start_pixels = warm_start_inputs(tmp_path)
    warm_start = ShowTellRL.from_pretrained(WARM_START).cuda()
    attention = regions_show_tell(image_attention=True).cuda()
    cases = [
        (warm_start, warm_start_pixels),
        (attention, {"image_features": torch.randn(8, 4, 6).cuda(), "image_feature_mask": REGION_MASK.cuda()}),
        (make_blip().cuda(), {"pixel_values": torch.randn(6, 3, BLIP_IMAGE_SIZE, BLIP_IMAGE_SIZE).cuda()}),
    ]
    settings = [DECODING_SETTINGS[name] for name in ("greedy", "pure sampling", "temperature, top-k, top-p")]
    autocast = torch.autocast("cuda", torch.bfloat16, enabled=precision == "bf16")
    for model, image_inputs in cases:
        captioner = captioner_for(model)
        decode = decode_blip if isinstance(model, BlipForConditionalGeneration) else decode_recurrent
        for update in range(2):  # the second round after an update of the weights in place, as an optimizer makes
            for setting in settings:
                config = captioner.complete_generation_config(setting)
                decoded = []
                step_by_step = copy.deepcopy(config)
                step_by_step.cuda_graphs = False
                for decoding in (step_by_step, config, config):  # the second graph call replays the captured graph
                    torch.manual_seed(update)
                    with evaluation_mode(model), autocast:
                        decoded.append(decode(model, image_inputs, decoding))
                assert torch.equal(decoded[0], decoded[1]) and torch.equal(decoded[0], decoded[2])
                # untrimmed, as an RL step asks for it so as not to wait: the same tokens, padded to the budget
                torch.manual_seed(update)
                with evaluation_mode(model), autocast:
                    untrimmed = decode(model, image_inputs, config, trim=False)
                width = decoded[0].shape[1]
                assert untrimmed.shape == (decoded[0].shape[0], config.max_new_tokens + 1)
                assert torch.equal(untrimmed[:, :width], decoded[0])
                assert (untrimmed[:, width:] == config.pad_token_id).all()
            with torch.no_grad():
                for parameter in model.parameters():
                    parameter.add_(0.05 * torch.randn_like(parameter))
        assert 0 < len(step_decoding._CAPTURED_CALLS[model]) <= step_decoding.MAX_GRAPHS_PER_MODEL


def test_the_texts_of_samples_the_gpu_still_decodes_are_read_ahead_of_the_work_queued_after_them(tmp_path):
    processor, inputs = warm_start_inputs(tmp_path)
    model = ShowTellRL.from_pretrained(WARM_START).cuda()
    config = captioner_for(model).complete_generation_config(DECODING_SETTINGS["pure sampling"])
    decoded = {}
    for trim in (True, False):  # the second decoding of the shape is captured as a graph, and replayed
        torch.manual_seed(0)
        with evaluation_mode(model):
            decoded[trim] = decode_recurrent(model, inputs, config, trim=trim)
    assert decoded[False].shape[1] == config.max_new_tokens + 1
    captions = GeneratedCaptions(decoded[False], processor)
    matrix = torch.randn(8192, 8192, device="cuda")
    for _ in range(30):  # tens of milliseconds of work queued behind the decoding
        matrix = torch.tanh(matrix @ matrix)
    finished = torch.cuda.Event()
    finished.record()
    texts = captions.texts
    assert not finished.query()  # the texts were read while the work queued after them still ran
    assert texts == [text.strip() for text in processor.batch_decode(decoded[True], skip_special_tokens=True)]
    assert torch.isfinite(matrix).all()


def test_rollouts_replayed_as_a_graph_are_those_of_the_step_by_step_loop(tmp_path, monkeypatch):
    _, inputs = warm_start_inputs(tmp_path)
    model = ShowTellRL.from_pretrained(WARM_START).cuda()
    torch.manual_seed(0)
    with evaluation_mode(model):
        sequences = model.generate(**inputs, do_sample=True, max_new_tokens=16, num_return_sequences=2)
    mask = caption_token_mask(sequences, model.config.eos_token_id)
    image_index = torch.arange(32, device="cuda").repeat_interleave(2)
    num_rows = 3 * int((mask.sum(dim=1) - 1).sum())
    common = dict(
        num_rollouts=3, max_length=16, eos_token_id=model.config.eos_token_id, pad_token_id=model.config.pad_token_id,
        image_index=image_index, uniforms=torch.rand(num_rows, 16, device="cuda"), drop_finished_rows=False,
    )  # fmt: skip
    rollouts = []
    # step by step, then with graphs: the first call runs eagerly, the second captures and replays, the third replays
    for cuda_graphs in (False, True, True, True):
        model.generation_config.cuda_graphs = cuda_graphs
        rollouts.append(sample_rollouts(model, inputs, sequences, mask, **common).sequences)
    assert len(step_decoding._CAPTURED_CALLS[model]) == 1
    # the graph's loop, run eagerly on the same padded rows: the same rollouts, token for token
    with monkeypatch.context() as patch:
        patch.setattr(spider_pg, "graphed_call", lambda model, function, inputs, settings: function(**inputs))
        padded_eagerly = sample_rollouts(model, inputs, sequences, mask, **common).sequences
    assert torch.equal(rollouts[2], padded_eagerly) and torch.equal(rollouts[3], padded_eagerly)
    # the step-by-step loop runs on fewer rows, whose products may round otherwise and flip a near-tied draw
    assert (rollouts[0] == padded_eagerly).all(dim=1).float().mean() > 0.95


def test_rewards_reach_the_gpu_behind_the_queued_work_unchanged():
    values = np.linspace(-1.0, 2.0, 1000)
    queued = torch.randn(2048, 2048, device="cuda") @ torch.randn(2048, 2048, device="cuda")  # still running
    rewards = reward_tensor(values, torch.device("cuda"))
    assert rewards.device.type == "cuda" and rewards.dtype == torch.float32
    torch.testing.assert_close(rewards.cpu(), torch.as_tensor(values, dtype=torch.float32), rtol=0, atol=0)
    assert torch.isfinite(queued).all()


def test_host_values_are_copied_to_the_gpu_without_waiting_for_the_queued_work():
    values = torch.linspace(-1.0, 2.0, 1000, dtype=torch.float64)
    matrix = torch.randn(8192, 8192, device="cuda")
    for _ in range(30):  # tens of milliseconds of work queued before the copy
        matrix = torch.tanh(matrix @ matrix)
    finished = torch.cuda.Event()
    finished.record()
    copied = to_device_without_waiting(values, torch.device("cuda"))
    assert not finished.query()  # the host went on while the queued work still ran
    assert copied.device.type == "cuda" and copied.dtype == torch.float64
    torch.testing.assert_close(copied.cpu(), values, rtol=0, atol=0)  # behind the queued work, in stream order
    assert torch.isfinite(matrix).all()
