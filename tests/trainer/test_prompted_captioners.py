"""
RLCaptionTrainer trains and decodes the prompted image-text-to-text captioners (Florence-2, BLIP-2, PaliGemma,
SmolVLM, Qwen2-VL), each built tiny with its real processor class: decoding equals the model's own `generate()` with
the prompt cut off, teacher forcing equals a plain forward pass over the caption's positions, and every
sequence-level objective changes the weights with the library's default prompt.
"""

import copy
import types

import pytest
import torch
from transformers import GenerationConfig

from rlcaption.data.collator import CaptionCollator
from rlcaption.generation import caption_logits, captioner_for, image_inputs_of
from rlcaption.generation.prompted_captioners import PromptedDecoderCaptioner, image_placeholder_token_ids
from rlcaption.trainer import RLCaptionConfig, RLCaptionTrainer
from tiny_clips import save_reward_clip
from tiny_vlms import TINY_VLM_FAMILIES, make_tiny_vlm

DECODER_ONLY_FAMILY = "paligemma"
MAX_NEW_TOKENS = 8
# float32 forward passes of the same tokens, batched and padded differently
TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}
OBJECTIVES = {
    "xe": {"objective": "xe"},
    "scst_greedy": {"objective": "scst", "baseline": "greedy"},
    "scst_mean_of_others": {"objective": "scst", "baseline": "mean_of_others"},
}


def build(family: str, seed: int = 0):
    """The tiny captioner of `family` and its processor; skipped while tests/tiny_vlms.py builds none."""
    try:
        model, processor = make_tiny_vlm(family, seed=seed)
    except ValueError as error:
        if "Unknown captioner family" in str(error):
            pytest.skip(f"tests/tiny_vlms.py does not build {family} yet")
        raise
    if family == "smolvlm" and getattr(processor, "video_processor", None) is None:
        # SmolVLMProcessor.apply_chat_template reads its video processor's frame settings even for an image turn;
        # the published processors have one (it needs torchvision, which the tests do without): its defaults
        processor.video_processor = types.SimpleNamespace(num_frames=64, fps=1)
    return model, processor


def collate(model, processor, rows, prompt=None, **collator_options):
    captioner = captioner_for(model)
    collator = CaptionCollator(
        processor, caption_tokens=captioner.tokens, prompt=captioner.prompt_text(processor, prompt), **collator_options
    )
    return collator(rows)


def processor_inputs(model, processor, rows):
    """The model's inputs as its own processor gives them for the default prompt, without rlcaption's collator."""
    prompt = captioner_for(model).prompt_text(processor)
    return processor(
        images=[[row["image"]] for row in rows], text=[prompt] * len(rows), padding=True, padding_side="left",
        return_tensors="pt",
    )  # fmt: skip


def is_decoder_only(model) -> bool:
    return isinstance(captioner_for(model), PromptedDecoderCaptioner)


def parameters_of(model):
    return {name: parameter.detach().clone() for name, parameter in model.named_parameters()}


def caption_length(completions, **columns):
    """A reward that tells apart the captions of a random model (CIDEr scores all of them 0, and so would the
    advantages be)."""
    return [float(len(completion)) for completion in completions]


def make_trainer(model, processor, dataset, tmp_path, reward_funcs=(caption_length,), **overrides):
    settings = {
        "output_dir": str(tmp_path / "out"),
        "use_cpu": True,
        "per_device_train_batch_size": 2,
        "max_steps": 2,
        "learning_rate": 1e-2,
        "save_strategy": "no",
        "logging_steps": 1,
        "disable_tqdm": True,
        "max_caption_length": MAX_NEW_TOKENS,
        "num_samples_per_image": 2,
        "seed": 0,
    }
    settings.update(overrides)
    return RLCaptionTrainer(
        model=model, args=RLCaptionConfig(**settings), processing_class=processor, train_dataset=dataset["train"],
        reward_funcs=list(reward_funcs) if reward_funcs else None,
    )  # fmt: skip


@pytest.fixture(scope="module")
def rows(tiny_shapes):
    return [tiny_shapes["train"][index] for index in range(3)]


@pytest.mark.parametrize("family", TINY_VLM_FAMILIES)
def test_greedy_captions_equal_the_model_generate_with_the_prompt_cut_off(family, rows):
    model, processor = build(family)
    model.eval()
    captioner = captioner_for(model)
    tokens = captioner.tokens
    greedy = GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=MAX_NEW_TOKENS)
    ours = captioner.generate(image_inputs_of(collate(model, processor, rows)), greedy)

    inputs = processor_inputs(model, processor, rows)
    with torch.no_grad():
        theirs = model.generate(
            **inputs, do_sample=False, max_new_tokens=MAX_NEW_TOKENS, eos_token_id=tokens.end_token_id,
            pad_token_id=tokens.pad_token_id,
        )  # fmt: skip
    # decoder-only: the prompt comes back first; encoder-decoder: the decoder start token
    new_tokens = theirs[:, inputs["input_ids"].size(1) :] if is_decoder_only(model) else theirs[:, 1:]
    assert torch.equal(ours[:, 0], torch.full_like(ours[:, 0], tokens.start_token_id))
    assert torch.equal(ours[:, 1:], new_tokens)
    texts = processor.batch_decode(ours, skip_special_tokens=True)
    assert texts == processor.batch_decode(new_tokens, skip_special_tokens=True)


def test_teacher_forcing_scores_a_caption_as_generate_decoded_it(rows):
    """The logits teacher forcing gives a decoded caption are those `generate()` decoded each of its tokens with, for
    k captions per image selected by `image_index` (position ids and masks of prompt + caption as generate's)."""
    for family in ("florence2", DECODER_ONLY_FAMILY, "qwen2_vl"):
        model, processor = build(family)
        model.eval()
        captioner = captioner_for(model)
        conditioning = image_inputs_of(collate(model, processor, rows))
        sampling = GenerationConfig(
            do_sample=True, num_return_sequences=2, max_new_tokens=MAX_NEW_TOKENS, output_logits=True,
            return_dict_in_generate=True,
        )  # fmt: skip
        # the same draws: rlcaption never lets a decoder-only model generate an image placeholder token
        their_sampling = copy.deepcopy(sampling)
        their_sampling.suppress_tokens = image_placeholder_token_ids(model.config) if is_decoder_only(model) else None
        torch.manual_seed(0)
        theirs = model.generate(**captioner._model_inputs(conditioning), generation_config=their_sampling)
        step_logits = torch.stack(theirs.logits, dim=1)  # (N, new tokens, V)
        torch.manual_seed(0)
        generated = captioner.generate(conditioning, sampling)
        sequences = getattr(generated, "sequences", generated)
        image_index = torch.arange(len(rows)).repeat_interleave(2)
        with torch.no_grad():
            logits = caption_logits(model, conditioning, sequences, image_index=image_index)
        real = (sequences[:, 1:] != captioner.tokens.pad_token_id).unsqueeze(-1)  # the pad after an end is not decoded
        torch.testing.assert_close(logits * real, step_logits[:, : logits.size(1)] * real, **TOLERANCE)


@pytest.mark.parametrize("family", TINY_VLM_FAMILIES)
def test_caption_logits_equal_a_plain_forward_over_the_caption_positions(family, rows):
    model, processor = build(family)
    model.eval()
    batch = collate(model, processor, rows, captions_per_image=1)
    captions, caption_mask = batch["caption_input_ids"], batch["caption_attention_mask"]
    with torch.no_grad():
        ours = caption_logits(model, image_inputs_of(batch), captions, caption_mask)
        inputs = processor_inputs(model, processor, rows)
        if is_decoder_only(model):
            # every prompt has the same length (one image size): no padding, plain positions
            prompt_length = inputs["input_ids"].size(1)
            inputs["input_ids"] = torch.cat([inputs["input_ids"], captions[:, 1:]], dim=1)
            inputs["attention_mask"] = torch.cat([inputs["attention_mask"], caption_mask[:, 1:]], dim=1)
            # PaliGemma's caption is the suffix it predicts (type 1); Qwen2-VL's words are text (type 0)
            for name, caption_type in (("token_type_ids", 1), ("mm_token_type_ids", 0)):
                if name in inputs:
                    caption_types = torch.full_like(captions[:, 1:], caption_type)
                    inputs[name] = torch.cat([inputs[name], caption_types], dim=1)
            inputs.pop("labels", None)
            plain = model(**inputs).logits[:, prompt_length - 1 : -1]
        else:
            plain = model(**inputs, decoder_input_ids=captions, decoder_attention_mask=caption_mask).logits[:, :-1]
    real = caption_mask[:, 1:].bool().unsqueeze(-1)
    torch.testing.assert_close(ours * real, plain * real, **TOLERANCE)


@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("family", TINY_VLM_FAMILIES)
def test_sequence_level_objectives_train_with_the_default_prompt(family, objective, tiny_shapes, tmp_path):
    model, processor = build(family)
    trainer = make_trainer(model, processor, tiny_shapes, tmp_path, **OBJECTIVES[objective])
    assert trainer.data_collator.prompt == captioner_for(model).prompt_text(processor)
    before = parameters_of(model)
    trainer.train()
    changed = [name for name, parameter in model.named_parameters() if not torch.equal(before[name], parameter)]
    assert changed, f"{objective} changed no weight of {family}"
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))


@pytest.mark.parametrize("family", [family for family in TINY_VLM_FAMILIES if family != "florence2"])
def test_decoder_only_captioners_never_sample_an_image_placeholder(family, rows):
    # the model's forward counts the placeholders of its whole input: a caption holding one could not be scored
    model, processor = build(family)
    placeholders = image_placeholder_token_ids(model.config)
    assert placeholders
    with torch.no_grad():  # a model that would write nothing but its image token
        model.get_output_embeddings().weight[placeholders[0]] *= 1000.0
    captioner = captioner_for(model)
    conditioning = image_inputs_of(collate(model, processor, rows))
    sampling = GenerationConfig(do_sample=True, num_return_sequences=3, max_new_tokens=MAX_NEW_TOKENS)
    sequences = captioner.generate(conditioning, sampling)
    assert not torch.isin(sequences[:, 1:], torch.tensor(placeholders)).any()
    image_index = torch.arange(len(rows)).repeat_interleave(3)
    with torch.no_grad():
        assert torch.isfinite(caption_logits(model, conditioning, sequences, image_index=image_index)).all()


@pytest.mark.parametrize("family", TINY_VLM_FAMILIES)
def test_scst_with_lora_trains_only_the_adapters_with_the_default_prompt(family, tiny_shapes, tmp_path):
    model, processor = build(family)
    before = {id(parameter): parameter.detach().clone() for parameter in model.parameters()}
    trainer = make_trainer(model, processor, tiny_shapes, tmp_path, objective="scst", use_peft=True, lora_r=4)
    trainer.train()
    adapters = {name: parameter for name, parameter in trainer.model.named_parameters() if "lora_" in name}
    assert adapters and all(parameter.requires_grad for parameter in adapters.values())
    # peft wraps the captioner's own layers: each of its weights is the tensor it was, unchanged
    base = [parameter for name, parameter in trainer.model.named_parameters() if "lora_" not in name]
    assert base and all(torch.equal(before[id(parameter)], parameter) for parameter in base)
    # lora_B starts at zero, so the adapters that moved off it are those the two steps trained
    assert any(parameter.abs().sum() > 0 for name, parameter in adapters.items() if "lora_B" in name), family


@pytest.mark.parametrize("family", ("florence2", DECODER_ONLY_FAMILY))
def test_sle_trains_prompted_captioners(family, tiny_shapes, tmp_path):
    model, processor = build(family)
    trainer = make_trainer(model, processor, tiny_shapes, tmp_path, objective="sle", num_samples_per_image=3)
    before = parameters_of(model)
    trainer.train()
    assert any(not torch.equal(before[name], parameter) for name, parameter in model.named_parameters())


@pytest.fixture(scope="module")
def reward_clip(tmp_path_factory, tiny_shapes):
    captions = [caption for captions in tiny_shapes["train"]["captions"] for caption in captions]
    return save_reward_clip(tmp_path_factory.mktemp("reward-clip"), captions)


@pytest.mark.parametrize("family", ("florence2", DECODER_ONLY_FAMILY))
def test_wtf_trains_prompted_captioners(family, tiny_shapes, reward_clip, tmp_path):
    model, processor = build(family)
    trainer = make_trainer(
        model, processor, tiny_shapes, tmp_path, reward_funcs=None, objective="wtf", reward_clip=reward_clip,
        wtf_num_beams=2, num_mined_neighbours=2, discriminator_learning_rate=1e-2,
    )  # fmt: skip
    before = parameters_of(model)
    trainer.train()
    assert any(not torch.equal(before[name], parameter) for name, parameter in model.named_parameters())


@pytest.mark.parametrize(
    ("objective", "reason"),
    [("spider_pg", "recurrent captioner"), ("psst", "recurrent captioners"), ("actor_critic", "recurrent")],
)
def test_objectives_of_recurrent_captioners_refuse_prompted_ones_saying_why(objective, reason, tiny_shapes, tmp_path):
    model, processor = build("florence2")
    with pytest.raises(ValueError, match=reason):
        make_trainer(model, processor, tiny_shapes, tmp_path, objective=objective)


def test_a_custom_prompt_is_what_the_model_reads(rows, tiny_shapes, tmp_path):
    model, processor = build("florence2")
    trainer = make_trainer(model, processor, tiny_shapes, tmp_path, prompt="<DETAILED_CAPTION>")
    prompt_ids = trainer.data_collator(rows)["prompt_input_ids"]
    expected = processor(images=[row["image"] for row in rows], text=["<DETAILED_CAPTION>"] * 3)["input_ids"]
    assert prompt_ids.tolist() == expected
    default_ids = collate(model, processor, rows)["prompt_input_ids"]
    assert prompt_ids.shape != default_ids.shape or not torch.equal(prompt_ids, default_ids)
    # and the chat-free decoder-only family: the prompt's words follow its image tokens
    model, processor = build(DECODER_ONLY_FAMILY)
    prompt_ids = collate(model, processor, rows, prompt="caption fr")["prompt_input_ids"]
    assert processor.tokenizer.decode(prompt_ids[0], skip_special_tokens=True).strip() == "caption fr"


def test_a_prompt_is_refused_for_a_captioner_that_takes_none(tiny_processor, tiny_model, tiny_shapes, tmp_path):
    with pytest.raises(ValueError, match="takes no prompt"):
        make_trainer(tiny_model, tiny_processor, tiny_shapes, tmp_path, prompt="caption en")
