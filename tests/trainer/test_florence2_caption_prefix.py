"""
Florence-2's forced `<s>`: published checkpoints start the decoder with `</s>` and force `<s>` (`forced_bos_token_id`),
as they were trained on `</s> <s> words </s>`. The tiny Florence-2 given a `forced_bos_token_id` is captioned and
trained that way: greedy captions equal its own `generate()` with its own generation config, teacher forcing reads
`</s> <s> words` as transformers' fine-tuning of the tokenizer's `<s> words </s>` does, and the sequences objectives
see carry no `<s>`.
"""

import pytest
import torch
from test_prompted_captioners import OBJECTIVES, build, collate, make_trainer, parameters_of, processor_inputs
from transformers import GenerationConfig

from rlcaption.generation import caption_logits, captioner_for, image_inputs_of

MAX_NEW_TOKENS = 8
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


@pytest.fixture(scope="module")
def rows(tiny_shapes):
    return [tiny_shapes["train"][index] for index in range(3)]


def florence2_forcing_bos():
    model, processor = build("florence2")
    model.generation_config.forced_bos_token_id = processor.tokenizer.bos_token_id
    model.eval()
    return model, processor


def test_the_forced_token_is_the_caption_prefix():
    model, processor = florence2_forcing_bos()
    assert captioner_for(model).caption_prefix_ids == (processor.tokenizer.bos_token_id,)
    plain, _ = build("florence2")
    assert captioner_for(plain).caption_prefix_ids == ()


def test_greedy_captions_equal_the_model_generate_with_its_own_generation_config(rows):
    model, processor = florence2_forcing_bos()
    captioner = captioner_for(model)
    greedy = GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=MAX_NEW_TOKENS)
    ours = captioner.generate(image_inputs_of(collate(model, processor, rows)), greedy)
    with torch.no_grad():
        # its own config: decoder start `</s>`, then `<s>` forced as the first of its new tokens
        theirs = model.generate(**processor_inputs(model, processor, rows), max_new_tokens=MAX_NEW_TOKENS + 1)
    bos = processor.tokenizer.bos_token_id
    assert torch.equal(theirs[:, 1], torch.full_like(theirs[:, 1], bos))
    assert torch.equal(ours[:, 0], theirs[:, 0])
    assert torch.equal(ours[:, 1:], theirs[:, 2:])  # the same words, without the prefix
    assert processor.batch_decode(ours, skip_special_tokens=True) == processor.batch_decode(
        theirs, skip_special_tokens=True
    )


@pytest.mark.parametrize("captions_per_image", [1, 2])
def test_teacher_forcing_reads_start_then_bos_as_transformers_fine_tuning(captions_per_image, rows):
    model, processor = florence2_forcing_bos()
    batch = collate(model, processor, rows, captions_per_image=captions_per_image)
    captions, mask = batch["caption_input_ids"], batch["caption_attention_mask"]
    image_index = batch["caption_image_index"] if captions_per_image > 1 else None
    inputs = image_inputs_of(batch)
    read = []
    model.register_forward_pre_hook(
        lambda module, args, kwargs: read.append(kwargs["decoder_input_ids"]), with_kwargs=True
    )
    with torch.no_grad():
        ours = caption_logits(model, inputs, captions, mask, image_index=image_index)
    start, bos = captioner_for(model).tokens.start_token_id, processor.tokenizer.bos_token_id
    assert torch.equal(read[0][:, :2], torch.tensor([[start, bos]]).expand(captions.size(0), -1))
    assert not (captions == bos).any(), "references carry no <s>: the sequences objectives see go without it"

    # transformers' fine-tuning: labels are the tokenizer's `<s> words </s>`, the decoder reads them after `</s>`
    texts = [caption for row in rows for caption in row["captions"]]
    texts = [next(text for text in texts if processor.tokenizer.decode(ids, skip_special_tokens=True).strip() == text)
             for ids in captions]  # fmt: skip
    labels = processor.tokenizer(texts, padding=True, return_tensors="pt")
    assert torch.equal(labels["input_ids"][:, 0], torch.full_like(labels["input_ids"][:, 0], bos))
    rows_of_captions = image_index if image_index is not None else torch.arange(len(rows))
    conditioning = processor_inputs(model, processor, [rows[row] for row in rows_of_captions.tolist()])
    decoder_ids = torch.cat([torch.full_like(labels["input_ids"][:, :1], start), labels["input_ids"]], dim=1)
    decoder_mask = torch.cat([torch.ones_like(labels["attention_mask"][:, :1]), labels["attention_mask"]], dim=1)
    with torch.no_grad():
        theirs = model(**conditioning, decoder_input_ids=decoder_ids, decoder_attention_mask=decoder_mask).logits
    # theirs[:, 1 + t] scores word t + 1 after `</s> <s>`; ours[:, t] scores the token t + 1 of `</s> words </s>`
    words = mask[:, 1:].bool().unsqueeze(-1)
    width = ours.size(1)
    torch.testing.assert_close(ours * words, theirs[:, 1 : 1 + width] * words, **TOLERANCE)


def test_samples_are_scored_under_the_distribution_that_decoded_them(rows):
    model, processor = florence2_forcing_bos()
    captioner = captioner_for(model)
    conditioning = image_inputs_of(collate(model, processor, rows))
    sampling = GenerationConfig(
        do_sample=True, num_return_sequences=2, max_new_tokens=MAX_NEW_TOKENS, output_logits=True,
        return_dict_in_generate=True,
    )  # fmt: skip
    torch.manual_seed(0)
    generated = captioner.generate(conditioning, sampling)
    step_logits = torch.stack(generated.logits, dim=1)  # (N, new tokens, V): the prefix was given, not decoded
    assert generated.sequences.size(1) == 1 + step_logits.size(1)
    image_index = torch.arange(len(rows)).repeat_interleave(2)
    with torch.no_grad():
        logits = caption_logits(model, conditioning, generated.sequences, image_index=image_index)
    real = (generated.sequences[:, 1:] != captioner.tokens.pad_token_id).unsqueeze(-1)
    torch.testing.assert_close(logits * real, step_logits[:, : logits.size(1)] * real, **TOLERANCE)


@pytest.mark.parametrize("objective", ["xe", "scst_greedy"])
def test_objectives_train_with_the_caption_prefix(objective, tiny_shapes, tmp_path):
    model, processor = florence2_forcing_bos()
    trainer = make_trainer(model, processor, tiny_shapes, tmp_path, **OBJECTIVES[objective])
    read = []
    model.register_forward_pre_hook(
        lambda module, args, kwargs: read.append(kwargs.get("decoder_input_ids")), with_kwargs=True
    )
    before = parameters_of(model)
    trainer.train()
    assert any(not torch.equal(before[name], parameter) for name, parameter in model.named_parameters())
    # every pass that scores captions with gradients read the prefix after the start token
    bos = processor.tokenizer.bos_token_id
    scored = [ids for ids in read if ids is not None and ids.size(1) > 2]
    assert scored and all(bool((ids[:, 1] == bos).all()) for ids in scored)
