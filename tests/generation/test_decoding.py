"""Decoding helpers work for our models and for transformers captioners we did not write."""

import copy

import pytest
import torch
from torch import nn
from transformers import (
    GenerationConfig,
    GenerationMixin,
    GPT2Config,
    GPT2LMHeadModel,
    PretrainedConfig,
    PreTrainedModel,
)

from rlcaption.generation.captioners import captioner_for
from rlcaption.generation.decoding import (
    GeneratedCaptions,
    caption_logits,
    caption_token_mask,
    generate_captions,
    sample_token_log_probs,
    selective_log_softmax,
    token_log_probs,
)
from rlcaption.processing import CaptionProcessor
from tiny_captioners import FOREIGN_CAPTIONERS, make_foreign_captioner, make_show_tell, make_vision_encoder_decoder

IMAGE_SIZE = 32
CAPTIONS = ["a red circle", "a blue square left of a green star", "two shapes on a white background"]


@pytest.fixture(scope="module")
def processor():
    return CaptionProcessor.from_captions(CAPTIONS, image_size=IMAGE_SIZE)


@pytest.fixture(scope="module")
def show_tell(processor):
    return make_show_tell(processor, IMAGE_SIZE).eval()


def images(batch_size: int) -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(batch_size, 3, IMAGE_SIZE, IMAGE_SIZE)


def test_image_index_encodes_each_image_once_with_the_same_result(show_tell, processor):
    pixel_values = images(2)
    encoded = processor(text=CAPTIONS + CAPTIONS[:1], return_tensors="pt")
    image_index = torch.tensor([0, 0, 1, 1])
    shared = caption_logits(
        show_tell, {"pixel_values": pixel_values}, encoded["input_ids"], encoded["attention_mask"], image_index
    )
    repeated = caption_logits(
        show_tell, {"pixel_values": pixel_values[image_index]}, encoded["input_ids"], encoded["attention_mask"]
    )
    torch.testing.assert_close(shared, repeated)


@pytest.mark.parametrize("kind", FOREIGN_CAPTIONERS)
def test_foreign_captioners_encode_each_image_once_for_its_captions_with_the_same_logits_and_gradients(kind):
    model, foreign_processor = make_foreign_captioner(kind, CAPTIONS, IMAGE_SIZE)
    captioner = captioner_for(model)
    input_ids = torch.randint(5, len(foreign_processor.tokenizer), (4, 6), generator=torch.Generator().manual_seed(0))
    input_ids[:, 0] = captioner.tokens.start_token_id
    attention_mask = torch.tensor([[1] * 6, [1] * 6, [1] * 4 + [0] * 2, [1] * 3 + [0] * 3])
    pixel_values, image_index = images(2), torch.tensor([0, 0, 1, 1])
    vision = {"vit_gpt2": "encoder", "vit_bert": "encoder", "blip": "vision_model", "git": "git.image_encoder"}[kind]
    encoded_rows = []
    model.get_submodule(vision).register_forward_hook(lambda module, args, kwargs, output: encoded_rows.append(
        (args[0] if args else kwargs["pixel_values"]).shape[0]), with_kwargs=True)  # fmt: skip

    def logits_and_gradients(image_inputs, index):
        model.zero_grad()
        logits = caption_logits(model, image_inputs, input_ids, attention_mask, index)
        logits.square().mean().backward()
        # (a pooler the captioner never reads gets no gradient either way)
        parameters = model.get_submodule(vision).parameters()
        return logits.detach(), [torch.zeros(()) if p.grad is None else p.grad.clone() for p in parameters]

    shared, shared_gradients = logits_and_gradients({"pixel_values": pixel_values}, image_index)
    repeated, repeated_gradients = logits_and_gradients({"pixel_values": pixel_values[image_index]}, None)
    torch.testing.assert_close(shared, repeated)
    for shared_gradient, repeated_gradient in zip(shared_gradients, repeated_gradients, strict=True):
        torch.testing.assert_close(shared_gradient, repeated_gradient)
    # GIT's image tokens pass through its transformer with each caption: there, the images are repeated
    assert encoded_rows == ([4, 4] if kind == "git" else [2, 4])


@pytest.mark.parametrize("model_kind", ["show_tell", "vision_encoder_decoder"])
def test_log_probs_of_generated_captions_match_generation_scores(model_kind, show_tell, processor):
    model = show_tell if model_kind == "show_tell" else make_vision_encoder_decoder(processor, IMAGE_SIZE).eval()
    eos = processor.tokenizer.eos_token_id
    pixel_values = images(3)
    generated = generate_captions(
        model, processor, {"pixel_values": pixel_values}, do_sample=False, num_beams=1, max_length=8,
        output_scores=True, return_dict_in_generate=True,
    )  # fmt: skip
    assert generated.sequences[:, 0].eq(processor.tokenizer.bos_token_id).all()
    assert len(generated.texts) == 3
    log_probs = token_log_probs(model, {"pixel_values": pixel_values}, generated.sequences)
    mask = caption_token_mask(generated.sequences, eos)
    # greedy decoding picks the argmax token: its log-probability is the max of the step's distribution
    logits = caption_logits(model, {"pixel_values": pixel_values}, generated.sequences)
    best = torch.log_softmax(logits.float(), dim=-1).max(dim=-1).values
    torch.testing.assert_close(log_probs * mask, best * mask, rtol=1e-5, atol=1e-5)


def test_selective_log_softmax_is_the_float32_log_probability_of_each_token():
    logits = torch.randn(2, 3, 7).to(torch.bfloat16)
    tokens = torch.randint(0, 7, (2, 3))
    expected = torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens[..., None]).squeeze(-1)
    assert selective_log_softmax(logits, tokens).dtype == torch.float32
    torch.testing.assert_close(selective_log_softmax(logits, tokens), expected)


def test_the_model_scores_captions_as_the_library_does(show_tell, processor):
    # the model's own method (its modeling file stands alone) and the library's scoring of every captioner agree
    encoded = processor(text=CAPTIONS, return_tensors="pt")
    ids, mask = encoded["input_ids"], encoded["attention_mask"]
    pixel_values = images(3)
    via_model = show_tell.caption_log_probs(ids, mask, pixel_values=pixel_values)
    shared = token_log_probs(show_tell, {"pixel_values": pixel_values}, ids, mask)
    torch.testing.assert_close(via_model, shared.masked_fill(mask[:, 1:] == 0, 0.0))


# ----------------------------------------------------------------------------------------------------------------
# Every captioner family: ours and transformers captioners with their own processors
# ----------------------------------------------------------------------------------------------------------------

CAPTIONERS = (*FOREIGN_CAPTIONERS, "show_tell")


def build(kind, processor, dropout: float = 0.0):
    if kind == "show_tell":
        return make_show_tell(processor, IMAGE_SIZE, dropout=dropout), processor
    return make_foreign_captioner(kind, CAPTIONS, IMAGE_SIZE)


@pytest.mark.parametrize("kind", CAPTIONERS)
def test_log_probs_of_sampled_captions_are_those_of_the_sampling_distribution(kind, processor):
    model, own_processor = build(kind, processor)
    model.eval()
    captioner = captioner_for(model)
    image_inputs = {"pixel_values": images(2)}
    sampling = GenerationConfig(
        do_sample=True, top_k=0, num_return_sequences=3, max_new_tokens=7, output_scores=True,
        return_dict_in_generate=True,
    )  # fmt: skip
    torch.manual_seed(0)
    output = captioner.generate(image_inputs, sampling)
    sequences = output.sequences
    assert sequences[:, 0].eq(captioner.tokens.start_token_id).all()
    assert len(own_processor.batch_decode(sequences, skip_special_tokens=True)) == 6
    image_index = torch.arange(2).repeat_interleave(3)
    log_probs = token_log_probs(model, image_inputs, sequences, image_index=image_index)
    assert log_probs.shape == (6, sequences.size(1) - 1)  # the caption's tokens only, whatever the model's layout
    sampled = torch.log_softmax(torch.stack(output.scores, dim=1).float(), dim=-1)
    sampled = sampled.gather(-1, sequences[:, 1:, None]).squeeze(-1)
    mask = caption_token_mask(sequences, captioner.tokens.end_token_id).bool()
    torch.testing.assert_close(log_probs[mask], sampled[mask], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", CAPTIONERS)
def test_an_explicit_generation_config_ignores_the_model_generation_settings(kind, processor):
    model, own_processor = build(kind, processor)
    plain = copy.deepcopy(model)
    # what a Hub checkpoint's generation config may carry (BLIP decodes with its text decoder's)
    checkpoint_settings = {
        "repetition_penalty": 5.0, "no_repeat_ngram_size": 1, "min_new_tokens": 6, "max_new_tokens": 2,
        "bad_words_ids": [[7]], "forced_eos_token_id": 8, "suppress_tokens": [9], "num_beams": 3, "top_k": 2,
    }  # fmt: skip
    for module in model.modules():
        if isinstance(getattr(module, "generation_config", None), GenerationConfig):
            for name, value in checkpoint_settings.items():
                setattr(module.generation_config, name, value)
    image_inputs = {"pixel_values": images(3)}
    for settings in (
        GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=6),
        GenerationConfig(do_sample=True, top_k=0, num_return_sequences=2, max_new_tokens=6),
    ):
        torch.manual_seed(3)
        ours = generate_captions(model, own_processor, image_inputs, settings).sequences
        torch.manual_seed(3)
        expected = generate_captions(plain, own_processor, image_inputs, settings).sequences
        assert torch.equal(ours, expected), settings
    assert model.generation_config.repetition_penalty == 5.0  # the model's own settings are back


def test_scoring_samples_uses_the_sampling_network_state_and_restores_the_mode(show_tell, processor):
    model = make_show_tell(processor, IMAGE_SIZE, dropout=0.5).train()
    sequences = processor(text=CAPTIONS, return_tensors="pt")["input_ids"]
    image_inputs = {"pixel_values": images(3)}
    scored = sample_token_log_probs(model, image_inputs, sequences)
    assert model.training and scored.requires_grad
    with torch.no_grad():
        expected = token_log_probs(model.eval(), image_inputs, sequences)
    torch.testing.assert_close(scored.detach(), expected)


def test_special_tokens_are_the_model_ones_not_the_tokenizer_ones(processor):
    tokens = {kind: captioner_for(build(kind, processor)[0]).tokens for kind in CAPTIONERS}
    _, gpt2 = make_foreign_captioner("vit_gpt2", CAPTIONS, IMAGE_SIZE)
    end_of_text = gpt2.tokenizer.eos_token_id
    assert (tokens["vit_gpt2"].start_token_id, tokens["vit_gpt2"].end_token_id) == (end_of_text, end_of_text)
    assert tokens["vit_gpt2"].pad_token_id == end_of_text  # GPT-2 has no pad token
    _, bert = make_foreign_captioner("vit_bert", CAPTIONS, IMAGE_SIZE)
    cls, sep, pad = bert.tokenizer.cls_token_id, bert.tokenizer.sep_token_id, bert.tokenizer.pad_token_id
    assert bert.tokenizer.bos_token_id is None and bert.tokenizer.eos_token_id is None
    for kind in ("vit_bert", "git"):
        assert (tokens[kind].start_token_id, tokens[kind].end_token_id, tokens[kind].pad_token_id) == (cls, sep, pad)
    _, blip = make_foreign_captioner("blip", CAPTIONS, IMAGE_SIZE)
    assert tokens["blip"].start_token_id == blip.tokenizer.convert_tokens_to_ids("[DEC]") != cls
    assert tokens["blip"].end_token_id == sep


def test_a_bert_decoder_without_an_end_token_is_refused():
    model, _ = make_foreign_captioner("vit_bert", CAPTIONS, IMAGE_SIZE)
    model.generation_config.eos_token_id = None
    with pytest.raises(ValueError, match=r"declares no end token.*generation_config.eos_token_id.*sep_token_id"):
        captioner_for(model)


class _UnknownImageCaptioner(PreTrainedModel, GenerationMixin):
    config_class = PretrainedConfig

    def __init__(self, config):
        super().__init__(config)
        self.linear = nn.Linear(2, 2)

    def forward(self, input_ids=None, pixel_values=None):
        return self.linear(pixel_values)


def _text_only_model():
    return GPT2LMHeadModel(GPT2Config(n_embd=8, n_layer=1, n_head=2, vocab_size=10))


@pytest.mark.parametrize(
    ("make_model", "missing"),
    [
        (lambda: nn.Linear(2, 2), "Linear: it has no `generate\\(\\)`"),
        (_text_only_model, "GPT2LMHeadModel: it has no image input"),
        (lambda: _UnknownImageCaptioner(PretrainedConfig()), "_UnknownImageCaptioner: .*logits of a given caption"),
    ],
)
def test_an_unsupported_model_is_refused_naming_the_missing_capability(make_model, missing):
    with pytest.raises(ValueError, match=f"Cannot train or decode captions with {missing}.*Supported captioners"):
        captioner_for(make_model())


def test_generation_config_and_keyword_arguments_are_exclusive(show_tell, processor):
    with pytest.raises(ValueError, match=r"both a generation_config and generation keyword arguments \['num_beams'\]"):
        generate_captions(show_tell, processor, {"pixel_values": images(1)}, GenerationConfig(), num_beams=2)


def test_generated_captions_decode_their_texts_when_first_read_and_once(processor, monkeypatch):
    sequences = processor(text=["a red circle ", " two shapes", "a blue square"], return_tensors="pt")["input_ids"]
    decodings = []
    batch_decode = processor.batch_decode
    monkeypatch.setattr(processor, "batch_decode", lambda *a, **k: decodings.append(a) or batch_decode(*a, **k))
    captions = GeneratedCaptions(sequences, processor)
    assert decodings == [] and captions.sequences is sequences
    assert captions.texts == ["a red circle", "two shapes", "a blue square"]
    assert captions.texts == ["a red circle", "two shapes", "a blue square"] and len(decodings) == 1
    # texts known already are kept as they are
    assert GeneratedCaptions(sequences, texts=["a", "b", "c"]).texts == ["a", "b", "c"] and len(decodings) == 1
    with pytest.raises(ValueError, match="processor"):
        GeneratedCaptions(sequences)
