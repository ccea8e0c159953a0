"""One short run of every objective and phase, with each of our models: shared by the CPU rule test and the CUDA
tests."""

from __future__ import annotations

from tiny_training import IMAGE_SIZE

from rlcaption.models import PolicyValueCaptioner, SpeakerListener
from rlcaption.objectives.word_passing import WORD_PASSING_MODES
from rlcaption.objectives.wtf import WTF_VARIANTS
from rlcaption.rewards import get_reward
from rlcaption.trainer import RLCaptionConfig, RLCaptionTrainer
from tiny_captioners import make_show_tell

MAX_LENGTH = 8
SHOW_TELL = ("show_tell", "show_tell_attention")
# (objective, fields, models): each phase of an objective runs once (a pretraining phase of one step, then one step
# of the next); the wrapped models run the objectives that train them and the ones every captioner takes
CASES = [
    ("xe", {}, (*SHOW_TELL, "policy_value", "speaker_listener")),
    *[("scst", {"baseline": baseline}, SHOW_TELL) for baseline in ("greedy", "mean_of_others", "none")],
    ("scst", {"entropy_bonus_weight": 0.01}, (*SHOW_TELL, "policy_value", "speaker_listener")),
    ("spider_pg", {"baseline_pretraining_steps": 1, "num_rollouts": 2}, SHOW_TELL),
    ("sle", {}, SHOW_TELL),
    *[("wtf", {"wtf_variant": variant, "discriminator_pretraining_steps": 1}, SHOW_TELL) for variant in WTF_VARIANTS],
    ("wtf", {"discriminator_input": "image_text", "discriminator_pretraining_steps": 1}, SHOW_TELL),
    *[
        ("psst", {"psst_mode": mode, "listener_pretraining_steps": 1}, ("speaker_listener",))
        for mode in WORD_PASSING_MODES
    ],
    ("psst", {"psst_mode": "psst", "listener_pretraining_steps": 1}, ("speaker_listener_attention",)),
    ("actor_critic", {"value_pretraining_steps": 1}, ("policy_value", "policy_value_attention")),
]


def case_id(objective: str, fields: dict, kind: str) -> str:
    return "-".join([objective, *map(str, fields.values()), kind])


def build_model(kind: str, processor):
    """A tiny `show_tell[_attention]`, `policy_value[_attention]` or `speaker_listener[_attention]`, with dropout."""
    attention = kind.endswith("attention")
    show_tell = make_show_tell(processor, IMAGE_SIZE, dropout=0.2, image_attention=attention)
    if kind.startswith("policy_value"):
        return PolicyValueCaptioner.from_policy(
            show_tell, value_word_embedding_size=8, value_hidden_size=8, value_mlp_hidden_size=8
        )
    if kind.startswith("speaker_listener"):
        return SpeakerListener.from_speaker(show_tell, listener_hidden_size=8, joint_embedding_size=8)
    return show_tell


def make_step_trainer(
    objective, fields, kind, processor, shapes, output_dir, reward_clip, embedding_model, **overrides
) -> RLCaptionTrainer:
    """A trainer that runs every phase of `objective` once (`max_steps` 1, or 2 with a pretraining phase)."""
    has_pretraining = any(name.endswith("pretraining_steps") for name in fields)
    reward_funcs = None
    if objective == "actor_critic":
        reward_funcs = ["cider", get_reward("embedding", model=embedding_model)]
    elif objective in ("scst", "sle", "spider_pg"):
        reward_funcs = ["cider"]
    settings = dict(
        output_dir=str(output_dir), use_cpu=True, objective=objective, per_device_train_batch_size=4,
        max_steps=2 if has_pretraining else 1, learning_rate=1e-3, save_strategy="no", logging_steps=1,
        disable_tqdm=True, report_to="none", max_caption_length=MAX_LENGTH, num_samples_per_image=2, seed=0,
        **({"reward_clip": reward_clip, "wtf_num_beams": 2, "num_mined_neighbours": 2} if objective == "wtf" else {}),
        **fields,
    )  # fmt: skip
    settings.update(overrides)
    return RLCaptionTrainer(
        model=build_model(kind, processor), args=RLCaptionConfig(**settings), processing_class=processor,
        train_dataset=shapes["train"], reward_funcs=reward_funcs,
    )  # fmt: skip
