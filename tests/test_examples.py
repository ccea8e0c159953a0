"""The recipes run end to end as a user launches them (tiny settings)."""

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from peft import PeftModel
from PIL import Image

from rlcaption import CaptionProcessor, ShowTellRL, VisualSemanticEmbedding
from rlcaption.data import load_shapes
from tiny_captioners import make_foreign_captioner
from tiny_vlms import make_tiny_vlm

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_recipe(script: str, *arguments: str, cache_dir: Path) -> str:
    """Runs `examples/<script>` (or, when `script` starts with `-m`, a module such as `accelerate launch`)."""
    env = {**os.environ, "HF_DATASETS_CACHE": str(cache_dir), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    target = [script] if script.startswith("-") else [str(EXAMPLES / script)]
    command = [sys.executable, *target, *arguments]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_xe_then_scst_then_caption(tmp_path):
    common = ["--num_train_images", "16", "--use_cpu", "--per_device_train_batch_size", "4", "--save_strategy", "no"]
    run_recipe(
        "train_xe.py", "--output_dir", str(tmp_path / "xe"), "--hidden_size", "16", "--max_steps", "2",
        "--eval_strategy", "no", "--num_validation_images", "4", "--num_test_images", "4",
        "--scene_pretraining_steps", "2", *common, cache_dir=tmp_path / "cache",
    )  # fmt: skip
    assert (tmp_path / "xe" / "model.safetensors").is_file()
    assert (tmp_path / "xe" / "processor_config.json").is_file()
    # the warm start is judged on the test split, grounding included, and carries its card
    test_scores = json.loads((tmp_path / "xe" / "eval_results.json").read_text())["test"]
    assert {"CIDEr", "Bleu_4", "object_f1", "generic_share"} <= set(test_scores)
    card = (tmp_path / "xe" / "README.md").read_text()
    assert "model-index" in card
    # the card names the run that made it: the command and the code version (this repository's commit)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=EXAMPLES, capture_output=True, text=True).stdout.strip()
    command = rf"`python \S*examples/train_xe.py --output_dir {tmp_path / 'xe'} --hidden_size 16 "
    assert re.search(rf"\| run \| {command}", card)
    assert f"at git:{commit}" in card
    assert json.loads((tmp_path / "xe" / "config.json").read_text())["freeze_image_encoder"] is True

    run_recipe(
        "train_scst.py", "--model_name_or_path", str(tmp_path / "xe"), "--output_dir", str(tmp_path / "scst"),
        "--max_steps", "1", "--num_samples_per_image", "2", "--eval_strategy", "no", *common,
        cache_dir=tmp_path / "cache",
    )  # fmt: skip
    assert (tmp_path / "scst" / "model.safetensors").is_file()

    image = tmp_path / "scene.png"
    Image.new("RGB", (64, 64), "white").save(image)
    printed = run_recipe("caption.py", "--model", str(tmp_path / "scst"), str(image), cache_dir=tmp_path / "cache")
    # one line "path<TAB>caption"; a barely trained model may well give an empty caption
    lines = printed.rstrip("\n").split("\n")
    assert len(lines) == 1
    path, caption = lines[0].split("\t")
    assert path == str(image)
    assert caption == caption.lower()


def test_scst_recipe_fine_tunes_a_foreign_captioner_under_accelerate_and_resumes(tmp_path):

    shapes = load_shapes(num_train=16, num_validation=4, num_test=4)
    captions = [caption for row in shapes["train"]["captions"] for caption in row]
    model, processor = make_foreign_captioner("vit_gpt2", captions, image_size=48)
    model.save_pretrained(tmp_path / "vit_gpt2")
    processor.save_pretrained(tmp_path / "vit_gpt2")
    output_dir = tmp_path / "scst"
    launch = ["-m", "accelerate.commands.launch", "--cpu", "--num_processes", "1", "--num_machines", "1",
              "--mixed_precision", "no", "--dynamo_backend", "no"]  # fmt: skip
    arguments = [
        "--model_name_or_path", str(tmp_path / "vit_gpt2"), "--output_dir", str(output_dir),
        "--num_train_images", "16", "--num_validation_images", "4", "--num_test_images", "4",
        "--per_device_train_batch_size", "4", "--num_samples_per_image", "2", "--max_caption_length", "8",
        "--save_strategy", "steps", "--save_steps", "1", "--eval_strategy", "no",
    ]  # fmt: skip
    run_recipe(*launch, str(EXAMPLES / "train_scst.py"), *arguments, "--max_steps", "1", cache_dir=tmp_path / "c")
    assert (output_dir / "checkpoint-1" / "trainer_state.json").is_file()
    test_scores = json.loads((output_dir / "eval_results.json").read_text())["test"]
    assert {"CIDEr", "Bleu_4", "object_f1", "loss"} <= set(test_scores)
    card = (output_dir / "README.md").read_text()
    assert "VisionEncoderDecoderModel" in card and "AutoModelForImageTextToText" in card and "model-index" in card

    # launched again with more steps, the run continues from its checkpoint instead of starting over
    printed = run_recipe(
        *launch, str(EXAMPLES / "train_scst.py"), *arguments, "--max_steps", "2", cache_dir=tmp_path / "c"
    )
    assert f"Resuming from {output_dir / 'checkpoint-1'}" in printed
    state = json.loads((output_dir / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2


def test_scst_recipe_fine_tunes_florence_2_by_folder_with_lora_and_a_kl_leash(tmp_path):
    model, processor = make_tiny_vlm("florence2")
    model.save_pretrained(tmp_path / "florence2")
    processor.save_pretrained(tmp_path / "florence2")
    output_dir = tmp_path / "scst"
    run_recipe(
        "train_scst.py", "--model_name_or_path", str(tmp_path / "florence2"), "--output_dir", str(output_dir),
        "--use_cpu", "--num_train_images", "8", "--num_validation_images", "4", "--num_test_images", "4",
        "--per_device_train_batch_size", "4", "--num_samples_per_image", "2", "--max_caption_length", "8",
        "--max_steps", "2", "--use_peft", "--lora_r", "4", "--beta", "0.04", "--save_strategy", "no",
        "--eval_strategy", "no", cache_dir=tmp_path / "cache",
    )  # fmt: skip
    # the folder holds the adapters alone, with a card naming their base, and loads on that base
    assert (output_dir / "adapter_model.safetensors").is_file() and not (output_dir / "model.safetensors").exists()
    assert f"base_model: {tmp_path / 'florence2'}" in (output_dir / "README.md").read_text()
    adapted = PeftModel.from_pretrained(type(model).from_pretrained(tmp_path / "florence2"), output_dir)
    assert sum("lora_" in name for name, _ in adapted.named_parameters()) > 0
    assert "CIDEr" in json.loads((output_dir / "eval_results.json").read_text())["test"]


WARM_START = str(EXAMPLES.parent / "checkpoints" / "show-tell-rl-shapes-xe")
TINY_RUN = [
    "--model_name_or_path", WARM_START, "--num_train_images", "16", "--num_validation_images", "4",
    "--num_test_images", "6", "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "4",
    "--num_samples_per_image", "2", "--max_caption_length", "8", "--save_strategy", "no", "--eval_strategy", "no",
    "--use_cpu",
]  # fmt: skip


# Two processes of a recipe under the main suite once (PSST's, whose gloo shutdown once aborted; its one-process run
# is slow); the other recipes' two-process runs under `make test-slow`, which keeps `make test` within ten minutes on
# a 2-core machine.
TWO_PROCESSES_SLOW = pytest.param(2, marks=pytest.mark.slow)


def accelerate_launch(num_processes: int) -> list[str]:
    with socket.socket() as probe:  # a fresh port for each launch
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # two processes talk over gloo on the CPU (no GPU is visible to the recipes: see run_recipe)
    processes = ["--multi_gpu", "--num_processes", "2"] if num_processes == 2 else ["--cpu", "--num_processes", "1"]
    return ["-m", "accelerate.commands.launch", *processes, "--num_machines", "1", "--mixed_precision", "no",
            "--dynamo_backend", "no", "--main_process_port", str(port)]  # fmt: skip


@pytest.mark.parametrize("num_processes", [1, TWO_PROCESSES_SLOW])
def test_sle_recipe_scores_caption_sets_on_one_and_two_processes(tmp_path, num_processes):
    output_dir = tmp_path / "sle"
    run_recipe(
        *accelerate_launch(num_processes), str(EXAMPLES / "train_sle.py"), "--output_dir", str(output_dir),
        *TINY_RUN, "--max_steps", "1", "--eval_caption_set_size", "3", cache_dir=tmp_path / "cache",
    )  # fmt: skip
    scores = json.loads((output_dir / "eval_results.json").read_text())["test"]
    assert scores["num_images"] == 6
    assert {"CIDEr", "sample3_CIDEr", "sample3_Div-2", "beam3_mBLEU-4", "sample3_object_f1"} <= set(scores)
    assert "Div-2, 3 samples per image" in (output_dir / "README.md").read_text()


@pytest.mark.parametrize("num_processes", [pytest.param(1, marks=pytest.mark.slow), 2])
def test_psst_recipe_trains_a_speaker_listener_on_one_and_two_processes(tmp_path, num_processes):
    output_dir = tmp_path / "psst"
    run_recipe(
        *accelerate_launch(num_processes), str(EXAMPLES / "train_psst.py"), "--output_dir", str(output_dir),
        *TINY_RUN, "--max_steps", "1", "--listener_hidden_size", "16", "--joint_embedding_size", "16",
        "--score_validation", "True", cache_dir=tmp_path / "cache",
    )  # fmt: skip
    results = json.loads((output_dir / "eval_results.json").read_text())
    # the validation split scored as the test split is, the listener's recall included, for choices made on it
    assert results["validation"]["num_images"] == 4 and results["test"]["num_images"] == 6
    assert set(results["validation"]) == set(results["test"])
    scores = results["test"]
    assert {"CIDEr", "object_f1", "listener_R@1", "listener_R@10"} <= set(scores)
    assert 0.0 <= scores["listener_R@1"] <= scores["listener_R@10"] <= 1.0
    assert {"greedy_CIDEr", "greedy_listener_R@10"} <= set(scores)  # the greedy captions beside the beam-3 ones
    config = json.loads((output_dir / "config.json").read_text())
    assert config["model_type"] == "speaker_listener" and config["joint_embedding_size"] == 16
    card = (output_dir / "README.md").read_text()
    assert "Listener R@1 (caption to image)" in card and "Listener R@10 (caption to image) (greedy decoding)" in card
    assert "Joint Optimization for Cooperative Image Captioning" in card  # Vered et al. 2019, the psst paper


@pytest.mark.slow
@pytest.mark.parametrize("num_processes", [1, 2])
def test_wtf_recipe_runs_on_one_and_two_processes_and_reports_both_clips(tmp_path, num_processes):
    output_dir = tmp_path / "wtf"
    checkpoints = EXAMPLES.parent / "checkpoints"
    run_recipe(
        *accelerate_launch(num_processes), str(EXAMPLES / "train_wtf.py"), "--output_dir", str(output_dir),
        *TINY_RUN, "--max_steps", "2", "--discriminator_pretraining_steps", "1", "--wtf_num_beams", "2",
        "--reward_clip", str(checkpoints / "shapes-clip-reward"),
        "--eval_clip", str(checkpoints / "shapes-clip-evaluator"),
        cache_dir=tmp_path / "cache",
    )  # fmt: skip
    assert (output_dir / "mined_neighbours.safetensors").is_file()  # mined once, kept with the run
    scores = json.loads((output_dir / "eval_results.json").read_text())["test"]
    assert {"CIDEr", "Bleu_4", "ROUGE_L", "Self-BLEU", "object_f1", "t2i_R@1", "i2t_R@10"} <= set(scores)
    assert {"reward_clip_t2i_R@1", "reward_clip_i2t_R@10"} <= set(scores)
    card = (output_dir / "README.md").read_text()
    assert "Text-to-image R@1 (reward CLIP)" in card and "Text-to-image R@1 (evaluator CLIP)" in card
    assert "1 discriminator_pretraining, 1 joint" in card  # the steps each phase took


@pytest.mark.parametrize("num_processes", [1, TWO_PROCESSES_SLOW])
def test_actor_critic_recipe_trains_both_networks_and_scores_lookahead(tmp_path, num_processes):
    embedding = VisualSemanticEmbedding.from_captioner(ShowTellRL.from_pretrained(WARM_START), joint_embedding_size=16)
    embedding.save_pretrained(tmp_path / "embedding")
    CaptionProcessor.from_pretrained(WARM_START).save_pretrained(tmp_path / "embedding")
    output_dir = tmp_path / "actor_critic"
    run_recipe(
        *accelerate_launch(num_processes), str(EXAMPLES / "train_actor_critic.py"), "--output_dir", str(output_dir),
        *TINY_RUN, "--max_steps", "2", "--value_pretraining_steps", "1", "--value_hidden_size", "16",
        "--embedding_model", str(tmp_path / "embedding"), "--embedding_weight", "0.5", "--value_rnn_type", "lstm",
        "--lr_scheduler_type", "constant", "--lr_decay_factor", "0.9", cache_dir=tmp_path / "cache",
    )  # fmt: skip
    scores = json.loads((output_dir / "eval_results.json").read_text())["test"]
    assert {"CIDEr", "object_f1", "lookahead_CIDEr", "lookahead_object_f1"} <= set(scores)
    config = json.loads((output_dir / "config.json").read_text())
    assert config["model_type"] == "policy_value"
    assert config["value_rnn_type"] == "lstm"  # Ren et al.'s value network, as asked
    card = (output_dir / "README.md").read_text()
    assert "0.5·embedding" in card and "CIDEr-D (lookahead beam search)" in card
    assert "1 value_pretraining, 1 actor_critic" in card
    # published nowhere: the card's snippets load the folder the run was saved in
    assert f'from_pretrained("{output_dir}")' in card


def test_the_shipped_accelerate_configs_launch_a_recipe_without_guessing(tmp_path):
    from accelerate.commands.config.config_args import load_config_from_file

    configs = {name: load_config_from_file(str(EXAMPLES / "accelerate" / name)) for name in ("one_process.yaml",
               "two_processes.yaml", "fsdp.yaml")}  # fmt: skip
    assert {name: config.num_processes for name, config in configs.items()} == {
        "one_process.yaml": 1, "two_processes.yaml": 2, "fsdp.yaml": 2,
    }  # fmt: skip
    # the one kind of FSDP the trainer accepts: FSDP2, fully sharded
    assert configs["fsdp.yaml"].distributed_type == "FSDP"
    assert configs["fsdp.yaml"].fsdp_config["fsdp_version"] == 2
    assert configs["fsdp.yaml"].fsdp_config["fsdp_reshard_after_forward"] is True
    result = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
         str(EXAMPLES / "accelerate" / "one_process.yaml"), str(EXAMPLES / "train_xe.py"), "--help"],
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--output_dir" in result.stdout
    assert "had defaults used instead" not in result.stdout + result.stderr
