"""
Caption image files with a trained captioner, from a folder or a Hub id.

    python examples/caption.py --model runs/scst photo1.png photo2.jpg photos/ --num_beams 3

The same as the console command `rlcaption caption --model runs/scst photo1.png`.
"""

from dataclasses import dataclass, field

from transformers import HfArgumentParser

from rlcaption.inference import caption_image_files, list_image_files, load_captioner


@dataclass
class CaptionArguments:
    model: str = field(metadata={"help": "Model folder or Hub id."})
    num_beams: int = field(default=3, metadata={"help": "Beam size (1 = greedy)."})
    max_length: int = field(default=21, metadata={"help": "Maximum caption length in tokens, start token included."})


def main():
    parser = HfArgumentParser(CaptionArguments)
    args, image_paths = parser.parse_args_into_dataclasses(return_remaining_strings=True)
    if not image_paths:
        parser.error("give at least one image file or folder of images")
    image_paths = list_image_files(image_paths)  # a folder stands for the images in it
    model, processor = load_captioner(args.model, argument_name="--model")
    captions = caption_image_files(model, processor, image_paths, num_beams=args.num_beams, max_length=args.max_length)
    for path, caption in zip(image_paths, captions, strict=True):
        print(f"{path}\t{caption}")


if __name__ == "__main__":
    main()
