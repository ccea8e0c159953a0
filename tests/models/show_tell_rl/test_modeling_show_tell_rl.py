import itertools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModel

import rlcaption.auto  # noqa: F401  (registers the Auto classes)
from rlcaption.models import show_tell_rl
from rlcaption.models.show_tell_rl import CACHE_NAME, ShowTellRL, ShowTellRLConfig, ShowTellRLState

PAD, BOS, EOS = 0, 1, 2
SHOW_TELL_RL_FOLDER = Path(show_tell_rl.__file__).parent
# the recurrent-state contract (caching, beams, prefixes) must hold for Show and Tell and for Show, Attend and Tell
WITH_AND_WITHOUT_ATTENTION = pytest.mark.parametrize("image_attention", [False, True], ids=["show-tell", "attention"])
# ... and for attention over the padded regions of precomputed features
IMAGE_KINDS = pytest.mark.parametrize("image_kind", ["show-tell", "attention", "regions"])


def tiny_config(**overrides) -> ShowTellRLConfig:
    fields = dict(
        vocab_size=50,
        hidden_size=32,
        word_embedding_size=16,
        image_size=16,
        cnn_channels=[4, 8],
        max_caption_length=8,
        dropout=0.1,
    )
    fields.update(overrides)
    return ShowTellRLConfig(**fields)


def tiny_model(seed: int = 0, **overrides) -> ShowTellRL:
    torch.manual_seed(seed)
    return ShowTellRL(tiny_config(**overrides)).eval()


def random_captions(batch_size: int, length: int, seed: int = 1) -> torch.LongTensor:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 50, (batch_size, length), generator=generator)
    ids[:, 0] = BOS
    return ids


def random_pixels(batch_size: int, seed: int = 2) -> torch.FloatTensor:
    return torch.randn(batch_size, 3, 16, 16, generator=torch.Generator().manual_seed(seed))


def tiny_model_and_images(image_kind: str, batch_size: int, **overrides) -> tuple[ShowTellRL, dict]:
    """A tiny model and its image inputs: pixels through the CNN (`"show-tell"`, `"attention"`), or `"regions"`,
    precomputed features of 1, 2, 3, ... regions per image padded to 4 with a large constant, attended over."""
    if image_kind != "regions":
        model = tiny_model(image_attention=image_kind == "attention", **overrides)
        return model, {"pixel_values": random_pixels(batch_size)}
    model = tiny_model(
        encoder_type="features", image_feature_size=12, image_feature_layout="grid", image_attention=True, **overrides
    )
    features = torch.randn(batch_size, 4, 12, generator=torch.Generator().manual_seed(2))
    mask = (torch.arange(4) <= torch.arange(batch_size)[:, None] % 4).long()  # (B, 4)
    return model, {"image_features": features.masked_fill(mask[..., None] == 0, 100.0), "image_feature_mask": mask}


def manual_greedy(model: ShowTellRL, pixel_values: torch.Tensor, max_length: int) -> torch.LongTensor:
    """Greedy decoding written out with `initial_state` and `step` (finished rows are padded)."""
    state = model.initial_state(pixel_values)
    tokens = torch.full((pixel_values.shape[0],), BOS)
    sequences = [tokens]
    finished = torch.zeros_like(tokens, dtype=torch.bool)
    for _ in range(max_length - 1):
        logits, _, state = model.step(tokens, state)
        tokens = logits.argmax(-1).masked_fill(finished, PAD)
        sequences.append(tokens)
        finished |= tokens == EOS
        if finished.all():
            break
    return torch.stack(sequences, dim=1)


def sequence_log_prob(model: ShowTellRL, pixel_values: torch.Tensor, sequence: list[int]) -> float:
    ids = torch.tensor([sequence])
    return model.caption_log_probs(ids, pixel_values=pixel_values).sum().item()


# ------------------------------------------------------------------ config


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(encoder_type="transformer"), "encoder_type"),
        (dict(image_size=18), "divisible"),
        (dict(encoder_type="features"), "image_feature_size"),
        (dict(encoder_type="backbone"), "backbone"),
        (dict(eos_token_id=99), "eos_token_id"),
        (dict(eos_token_id=0), "must differ"),
        (dict(dropout=1.0), "dropout"),
        (dict(hidden_size=0), "hidden_size"),
        (dict(max_caption_length=0), "tokens after <bos>"),
    ],
)
def test_config_rejects_bad_values(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(**overrides)


# ------------------------------------------------------------------ forward


def test_output_shapes_and_loss_matches_manual_cross_entropy():
    model = tiny_model()
    ids = random_captions(3, 6)
    labels = ids.clone()
    labels[0, 4:] = PAD  # padding is ignored
    labels[1, 2] = -100
    out = model(ids, pixel_values=random_pixels(3), labels=labels, output_hidden_states=True)
    assert out.logits.shape == (3, 6, 50)
    assert out.hidden_states.shape == (3, 6, 32)
    assert isinstance(getattr(out, CACHE_NAME), ShowTellRLState) and getattr(out, CACHE_NAME).get_seq_length() == 6
    assert getattr(out, CACHE_NAME).hidden.shape == (1, 3, 32)
    log_probs = out.logits[:, :-1].log_softmax(-1)
    terms = [
        -log_probs[b, t, labels[b, t + 1]] for b in range(3) for t in range(5) if labels[b, t + 1] not in (PAD, -100)
    ]
    torch.testing.assert_close(out.loss, torch.stack(terms).mean())


@WITH_AND_WITHOUT_ATTENTION
def test_loss_backward_reaches_every_parameter(image_attention):
    model = tiny_model(num_layers=2, image_attention=image_attention)
    model.train()
    ids = random_captions(4, 5)
    model(ids, pixel_values=random_pixels(4), labels=ids).loss.backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name


@IMAGE_KINDS
def test_full_forward_equals_prefix_then_cached_steps(image_kind):
    model, images = tiny_model_and_images(image_kind, 3, num_layers=2)
    ids = random_captions(3, 7)
    full = model(ids, **images)
    prefix = model(ids[:, :3], **images)
    logits, cache = [prefix.logits], getattr(prefix, CACHE_NAME)
    # the image inputs must be ignored once there is a cache (an all-zero region mask would be refused)
    ignored_images = {name: torch.zeros_like(tensor) for name, tensor in images.items()}
    for t in range(3, 7):
        out = model(ids[:, t : t + 1], **ignored_images, cache=cache)
        logits.append(out.logits)
        cache = getattr(out, CACHE_NAME)
    torch.testing.assert_close(torch.cat(logits, dim=1), full.logits)
    torch.testing.assert_close(cache.hidden, getattr(full, CACHE_NAME).hidden)
    assert cache.get_seq_length() == 7


@pytest.mark.parametrize("image_attention", [False, True], ids=["mean", "attention"])
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_padding_leaves_the_state_unchanged(padding_side, image_attention):
    model = tiny_model(image_attention=image_attention)
    ids, pixels = random_captions(2, 6), random_pixels(2)
    short = ids[:1, :4]
    padded = ids.clone()
    mask = torch.ones_like(ids)
    if padding_side == "right":
        padded[0, 4:], mask[0, 4:] = PAD, 0
        out = model(padded, pixel_values=pixels, attention_mask=mask)
        valid_logits = out.logits[0, :4]
    else:
        padded[0] = torch.cat([torch.full((2,), PAD), short[0]])
        mask[0, :2] = 0
        out = model(padded, pixel_values=pixels, attention_mask=mask)
        valid_logits = out.logits[0, 2:]
    alone = model(short, pixel_values=pixels[:1])
    torch.testing.assert_close(valid_logits, alone.logits[0])
    # without a cache to return (training), right padding takes the single-call path, or with attention the loop
    # without carrying the state through padding: same scored logits, and the same gradients of what is scored
    no_cache = model(padded, pixel_values=pixels, attention_mask=mask, use_cache=False).logits[0]
    torch.testing.assert_close(no_cache[:4] if padding_side == "right" else no_cache[2:], alone.logits[0])
    gradients = []
    for use_cache in (True, False):
        model.zero_grad()
        logits = model(padded, pixel_values=pixels, attention_mask=mask, use_cache=use_cache).logits
        logits.logsumexp(dim=-1).mul(mask).sum().backward()
        gradients.append([parameter.grad.clone() for parameter in model.parameters() if parameter.grad is not None])
    for with_cache, without in zip(*gradients, strict=True):
        torch.testing.assert_close(with_cache, without)
    torch.testing.assert_close(getattr(out, CACHE_NAME).hidden[:, :1], getattr(alone, CACHE_NAME).hidden)
    torch.testing.assert_close(getattr(out, CACHE_NAME).cell[:, :1], getattr(alone, CACHE_NAME).cell)
    # the unpadded row is untouched by the other row's padding
    torch.testing.assert_close(out.logits[1], model(ids[1:], pixel_values=pixels[1:]).logits[0])


def test_precomputed_features_encoder():
    model = tiny_model(encoder_type="features", image_feature_size=12)
    features = torch.randn(2, 12)
    out = model(random_captions(2, 4), image_features=features)
    assert out.logits.shape == (2, 4, 50)
    with pytest.raises(ValueError, match="image_features"):
        model(random_captions(2, 4), pixel_values=random_pixels(2))
    with pytest.raises(ValueError, match=r"\(batch_size, 12\)"):
        model(random_captions(2, 4), image_features=torch.randn(2, 7))


TINY_VIT = dict(
    model_type="vit", image_size=16, patch_size=8, hidden_size=24, num_hidden_layers=1, num_attention_heads=2,
    intermediate_size=32,
)  # fmt: skip


def test_transformers_backbone_encoder_frozen():
    model = tiny_model(encoder_type="backbone", backbone_config=TINY_VIT, freeze_backbone=True)
    model.train()
    ids = random_captions(2, 4)
    model(ids, pixel_values=random_pixels(2), labels=ids).loss.backward()
    assert all(p.grad is None for p in model.image_encoder.backbone.parameters())
    assert model.image_projection.weight.grad is not None
    assert not model.image_encoder.backbone.training  # frozen: stays in eval mode


def test_backbone_tokens_are_the_attention_grid():
    model = tiny_model(encoder_type="backbone", backbone_config=TINY_VIT, image_attention=True)
    state = model.initial_state(random_pixels(2))
    assert state.image_grid.shape == (2, 5, 32)  # [CLS] + 2x2 patches, projected to hidden_size
    generated = model.generate(pixel_values=random_pixels(2), num_beams=2, max_length=6)
    assert (generated[:, 0] == BOS).all()


def test_backbone_loaded_from_a_pretrained_folder(tmp_path):
    from transformers import ViTConfig, ViTModel

    torch.manual_seed(5)
    vit = ViTModel(ViTConfig(image_size=16, patch_size=8, hidden_size=24, num_hidden_layers=1,
                             num_attention_heads=2, intermediate_size=32))  # fmt: skip
    vit.save_pretrained(tmp_path / "vit")
    model = tiny_model(encoder_type="backbone", backbone=str(tmp_path / "vit"))
    for name, value in vit.state_dict().items():
        torch.testing.assert_close(model.image_encoder.backbone.state_dict()[name], value)
    assert model.config.use_pretrained_backbone is False  # a saved copy does not reload the backbone


# ------------------------------------------------------------------ RL interface


@WITH_AND_WITHOUT_ATTENTION
def test_caption_log_probs_agree_with_forward_logits(image_attention):
    model = tiny_model(image_attention=image_attention)
    ids, pixels = random_captions(3, 6), random_pixels(3)
    ids[2, 4:] = PAD
    log_probs = model.caption_log_probs(ids, pixel_values=pixels)
    assert log_probs.shape == (3, 5)
    logits = model(ids, pixel_values=pixels).logits
    for b, t in itertools.product(range(3), range(5)):
        expected = 0.0 if ids[b, t + 1] == PAD else logits[b, t].log_softmax(-1)[ids[b, t + 1]].item()
        assert log_probs[b, t].item() == pytest.approx(expected, abs=1e-5)


@IMAGE_KINDS
def test_prefix_states_agree_with_step_by_step(image_kind):
    model, images = tiny_model_and_images(image_kind, 2, num_layers=2)
    ids = random_captions(2, 5)
    prefix_states = model.prefix_states(ids, **images)
    hidden, cell = prefix_states.hidden, prefix_states.cell
    assert hidden.shape == cell.shape == (2, 2, 5, 32)
    state = model.initial_state(**images)
    outputs = model(ids, **images, output_hidden_states=True).hidden_states
    for t in range(5):
        logits, top_hidden, state = model.step(ids[:, t], state)
        torch.testing.assert_close(hidden[:, :, t], state.hidden)
        torch.testing.assert_close(cell[:, :, t], state.cell)
        torch.testing.assert_close(top_hidden, outputs[:, t])
    # continuing from a prefix state gives the forward's next-token logits, also for rows picked out of order
    full_logits = model(ids, **images).logits
    resumed = prefix_states.state_after(torch.tensor([1, 0]), torch.tensor([3, 3]))
    logits, _, _ = model.step(ids[[1, 0], 3], resumed)
    torch.testing.assert_close(logits, full_logits[[1, 0], 3])


def test_attention_reads_the_image_at_every_step():
    # with attention, changing the image changes late-step logits even with the image-embedding path held equal
    model = tiny_model(image_attention=True)
    ids, pixels = random_captions(2, 6), random_pixels(2)
    state = model.initial_state(pixels)
    other = model.initial_state(random_pixels(2, seed=9))
    swapped = ShowTellRLState(state.hidden, state.cell, 0, other.image_grid, state.attention_output)
    logits, _, _ = model.step(ids[:, 0], state)
    swapped_logits, _, _ = model.step(ids[:, 0], swapped)
    assert not torch.allclose(logits, swapped_logits)
    with pytest.raises(ValueError, match="grid"):
        model.step(ids[:, 0], ShowTellRLState(state.hidden, state.cell, 0))


def test_attention_is_refused_for_pooled_precomputed_features():
    with pytest.raises(ValueError, match="feature grid"):
        tiny_config(encoder_type="features", image_feature_size=12, image_attention=True)


def test_checkpoint_with_the_former_baseline_head_still_loads(tmp_path, caplog):
    # before Liu et al.'s baseline became an auxiliary network of `spider_pg`, it was saved with the model
    model = tiny_model()
    model.save_pretrained(tmp_path)
    weights = load_file(str(tmp_path / "model.safetensors"))
    weights["baseline_head.0.weight"] = torch.randn(8, model.config.hidden_size)
    weights["baseline_head.0.bias"] = torch.randn(8)
    save_file(weights, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})

    loaded, info = ShowTellRL.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"]
    assert not any("baseline_head" in key for key in info["unexpected_keys"])
    for (name, expected), actual in zip(model.state_dict().items(), loaded.state_dict().values(), strict=True):
        torch.testing.assert_close(actual, expected, msg=name)


# ------------------------------------------------------------------ generate


@WITH_AND_WITHOUT_ATTENTION
def test_several_captions_per_image_encode_each_image_once(image_attention):
    model = tiny_model(image_attention=image_attention)
    pixels = random_pixels(3)
    encoded_rows = []
    encode_images = model.encode_images

    def counting_encode_images(pixel_values=None, image_features=None, image_feature_mask=None):
        encoded_rows.append(pixel_values.shape[0])
        return encode_images(pixel_values, image_features, image_feature_mask)

    model.encode_images = counting_encode_images
    torch.manual_seed(1)
    sampled = model.generate(pixel_values=pixels, do_sample=True, top_k=0, num_return_sequences=4, max_length=8)
    model.generate(pixel_values=pixels, num_beams=3, num_return_sequences=2, max_length=8)
    assert encoded_rows == [3, 3]
    # the same captions as from four copies of every image
    torch.manual_seed(1)
    repeated = model.generate(pixel_values=pixels.repeat_interleave(4, dim=0), do_sample=True, top_k=0, max_length=8)
    assert torch.equal(sampled, repeated)


@WITH_AND_WITHOUT_ATTENTION
def test_greedy_generate_equals_hand_written_greedy_loop(image_attention):
    model = tiny_model(image_attention=image_attention)
    pixels = random_pixels(4)
    generated = model.generate(pixel_values=pixels, max_length=8)
    assert (generated[:, 0] == BOS).all()
    torch.testing.assert_close(generated, manual_greedy(model, pixels, 8))
    uncached = model.generate(pixel_values=pixels, max_length=8, use_cache=False)
    torch.testing.assert_close(uncached, generated)


def test_max_caption_length_counts_the_tokens_after_bos_as_the_trainer_does():
    # an untrained model rarely ends a caption early: the default decoding runs to the configured length
    model = tiny_model(max_caption_length=5)
    assert model.generation_config.max_length == 6
    generated = model.generate(pixel_values=random_pixels(4))
    assert generated.size(1) <= 6
    torch.testing.assert_close(generated, manual_greedy(model, random_pixels(4), 6))


def test_greedy_generate_from_precomputed_features():
    model = tiny_model(encoder_type="features", image_feature_size=12)
    generated = model.generate(image_features=torch.randn(3, 12), max_length=6)
    assert generated.shape[0] == 3 and (generated[:, 0] == BOS).all()


def test_beam_search_with_one_beam_is_greedy():
    model = tiny_model()
    pixels = random_pixels(3)
    torch.testing.assert_close(
        model.generate(pixel_values=pixels, num_beams=1, max_length=8),
        model.generate(pixel_values=pixels, max_length=8),
    )


@WITH_AND_WITHOUT_ATTENTION
def test_beam_search_finds_the_brute_force_best_caption(image_attention):
    # vocabulary of 5 (3 special + 2 words), length <= 4: every caption can be enumerated
    model = tiny_model(vocab_size=5, seed=3, image_attention=image_attention)
    pixels = random_pixels(2)
    max_length = 4
    out = model.generate(
        pixel_values=pixels, num_beams=25, max_length=max_length, length_penalty=0.0, early_stopping=True,
        return_dict_in_generate=True, output_scores=True,
    )  # fmt: skip
    for b in range(2):
        candidates = []
        for length in range(1, max_length):
            for words in itertools.product([3, 4, EOS], repeat=length):
                ends = words[-1] == EOS or length == max_length - 1
                if ends and EOS not in words[:-1]:
                    candidates.append([BOS, *words])
        scored = {tuple(c): sequence_log_prob(model, pixels[b : b + 1], c) for c in candidates}
        best = max(scored, key=scored.get)
        found = [t for t in out.sequences[b].tolist() if t != PAD]
        assert tuple(found) == best
        assert out.sequences_scores[b].item() == pytest.approx(scored[best], abs=1e-4)


@WITH_AND_WITHOUT_ATTENTION
def test_beam_search_returned_scores_equal_recomputed_log_probs(image_attention):
    model = tiny_model(seed=4, image_attention=image_attention)
    pixels = random_pixels(2)
    out = model.generate(
        pixel_values=pixels, num_beams=4, num_return_sequences=3, max_length=8, length_penalty=0.0,
        return_dict_in_generate=True, output_scores=True,
    )  # fmt: skip
    assert out.sequences.shape[0] == 6
    for index, (row, score) in enumerate(zip(out.sequences, out.sequences_scores, strict=True)):
        tokens = [t for t in row.tolist() if t != PAD]
        image = pixels[index // 3 : index // 3 + 1]
        assert score.item() == pytest.approx(sequence_log_prob(model, image, tokens), abs=1e-4)
    # returned in order of decreasing score for each image
    scores = out.sequences_scores.view(2, 3)
    assert (scores[:, :-1] >= scores[:, 1:]).all()


@WITH_AND_WITHOUT_ATTENTION
def test_sampling_is_reproducible_and_num_return_sequences_shapes(image_attention):
    model = tiny_model(image_attention=image_attention)
    pixels = random_pixels(2)
    kwargs = dict(pixel_values=pixels, do_sample=True, top_k=10, top_p=0.9, temperature=0.8, max_length=8)
    torch.manual_seed(0)
    first = model.generate(num_return_sequences=3, **kwargs)
    torch.manual_seed(0)
    second = model.generate(num_return_sequences=3, **kwargs)
    torch.testing.assert_close(first, second)
    assert first.shape[0] == 6 and first.shape[1] <= 8 and (first[:, 0] == BOS).all()
    # samples of one image come from that image: rows 0-2 use image 0
    torch.manual_seed(0)
    alone = model.generate(**{**kwargs, "pixel_values": pixels[:1]}, num_return_sequences=3)
    assert alone.shape[0] == 3


# ------------------------------------------------------------------ saving and loading


@WITH_AND_WITHOUT_ATTENTION
def test_save_load_round_trip_gives_identical_outputs(tmp_path, image_attention):
    model = tiny_model(image_attention=image_attention)
    model.save_pretrained(tmp_path)
    reloaded = ShowTellRL.from_pretrained(tmp_path).eval()
    by_auto = AutoModel.from_pretrained(tmp_path).eval()
    assert isinstance(AutoConfig.from_pretrained(tmp_path), ShowTellRLConfig)
    ids, pixels = random_captions(2, 5), random_pixels(2)
    expected = model(ids, pixel_values=pixels).logits
    torch.testing.assert_close(reloaded(ids, pixel_values=pixels).logits, expected, rtol=0, atol=0)
    torch.testing.assert_close(by_auto(ids, pixel_values=pixels).logits, expected, rtol=0, atol=0)
    torch.testing.assert_close(reloaded.generate(pixel_values=pixels), model.generate(pixel_values=pixels))


def build_local_hub_cache(cache_dir, repo_id: str, model_dir) -> None:
    """Lay out `model_dir`'s files as the Hub cache does: refs/main -> snapshots/<revision>/."""
    revision = "0123456789abcdef0123456789abcdef01234567"
    repo_dir = cache_dir / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo_dir / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(revision)
    for file in model_dir.iterdir():
        (snapshot / file.name).write_bytes(file.read_bytes())


# slow: the published checkpoints load by hub id in the main suite (tests/test_published_checkpoints.py), and
# AutoModel reads saved folders there too (test_saved_checkpoint_loads_with_trust_remote_code_without_rlcaption)
@pytest.mark.slow
def test_load_by_hub_id_from_local_cache_offline(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path / "saved")
    build_local_hub_cache(tmp_path / "hub", "rlcaption-test/show-tell-tiny", tmp_path / "saved")
    script = textwrap.dedent(
        """
        import torch, rlcaption.auto
        from transformers import AutoModel
        model = AutoModel.from_pretrained("rlcaption-test/show-tell-tiny").eval()
        torch.save(model(torch.tensor([[1, 5, 6]]), pixel_values=torch.ones(1, 3, 16, 16)).logits, "{out}")
        """
    ).format(out=tmp_path / "logits.pt")
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, capture_output=True)
    expected = model(torch.tensor([[1, 5, 6]]), pixel_values=torch.ones(1, 3, 16, 16)).logits
    # another process may pick other CPU kernels: equal up to float rounding
    torch.testing.assert_close(torch.load(tmp_path / "logits.pt"), expected)


def test_a_saved_checkpoint_carries_no_code_by_default(tmp_path):
    tiny_model().save_pretrained(tmp_path / "saved")
    assert not list((tmp_path / "saved").glob("*.py"))
    assert "auto_map" not in (tmp_path / "saved" / "config.json").read_text()


@pytest.fixture
def registered_for_remote_code():
    ShowTellRLConfig.register_for_auto_class("AutoConfig")
    ShowTellRL.register_for_auto_class("AutoModel")
    yield
    ShowTellRLConfig._auto_class = None
    ShowTellRL._auto_class = None


def test_saved_checkpoint_loads_with_trust_remote_code_without_rlcaption(tmp_path, registered_for_remote_code):
    model = tiny_model(image_attention=True)
    model.save_pretrained(tmp_path / "saved")
    # the modeling file and the files of its folder that it imports relatively (transformers follows the imports),
    # each a verbatim copy: no import line is rewritten
    saved_code = sorted(path.name for path in (tmp_path / "saved").glob("*.py"))
    assert saved_code == [
        "configuration_show_tell_rl.py", "encoders.py", "hub_errors.py", "modeling_show_tell_rl.py",
        "state_show_tell_rl.py",
    ]  # fmt: skip
    for name in saved_code:
        assert (tmp_path / "saved" / name).read_text() == (SHOW_TELL_RL_FOLDER / name).read_text(), name
    pixels = random_pixels(2)
    torch.save(pixels, tmp_path / "pixels.pt")
    # `-I` keeps the working directory and PYTHON* variables off the path; the editable install's entry for src/ is
    # dropped by hand, so the package cannot be imported at all, as for a user who never installed it
    script = textwrap.dedent(
        """
        import importlib.util, sys, torch
        from pathlib import Path
        sys.path = [entry for entry in sys.path if Path(entry or ".").resolve() != Path("{src}")]
        assert importlib.util.find_spec("rlcaption") is None, "rlcaption is importable"
        from transformers import AutoModel
        model = AutoModel.from_pretrained("{saved}", trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        pixels = torch.load("{pixels}")
        with torch.no_grad():
            logits = model(torch.tensor([[1, 5, 6], [1, 7, 8]]), pixel_values=pixels).logits
            sequences = model.generate(pixel_values=pixels)
        torch.save({{"logits": logits, "sequences": sequences}}, "{out}")
        assert not [name for name in sys.modules if name.split(".")[0] == "rlcaption"]
        model.save_pretrained("{resaved}")  # a model loaded from remote code saves the same code again
        """
    ).format(
        src=SHOW_TELL_RL_FOLDER.parents[2].resolve(), saved=tmp_path / "saved", pixels=tmp_path / "pixels.pt",
        out=tmp_path / "outputs.pt", resaved=tmp_path / "resaved",
    )  # fmt: skip
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-I", "-c", script], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    remote = torch.load(tmp_path / "outputs.pt")
    with torch.no_grad():
        expected_logits = model(torch.tensor([[1, 5, 6], [1, 7, 8]]), pixel_values=pixels).logits
        expected_sequences = model.generate(pixel_values=pixels)
    torch.testing.assert_close(remote["sequences"], expected_sequences, rtol=0, atol=0)
    # another process may pick other CPU kernels: equal up to float rounding
    torch.testing.assert_close(remote["logits"], expected_logits)
    for name in saved_code:
        assert (tmp_path / "resaved" / name).read_text() == (SHOW_TELL_RL_FOLDER / name).read_text(), name


def test_a_frozen_image_encoder_stays_frozen_after_saving(tmp_path):
    model = tiny_model()
    model.freeze_image_encoder()
    model.train()
    ids = random_captions(2, 5)
    model(ids, pixel_values=random_pixels(2), labels=ids).loss.backward()
    assert all(parameter.grad is None for parameter in model.image_encoder.parameters())
    assert model.lstm.weight_hh_l0.grad is not None
    model.save_pretrained(tmp_path)
    reloaded = ShowTellRL.from_pretrained(tmp_path)
    assert not any(parameter.requires_grad for parameter in reloaded.image_encoder.parameters())
    reloaded.freeze_image_encoder(False)
    assert all(parameter.requires_grad for parameter in reloaded.image_encoder.parameters())
    with pytest.raises(ValueError, match="freeze_backbone"):
        tiny_model(encoder_type="features", image_feature_size=12).freeze_image_encoder()
