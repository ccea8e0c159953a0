from setuptools import find_packages, setup

setup(
    name="rlcaption",
    version="0.1.0.dev0",
    description="Reinforcement learning for image captioning, native to the Hugging Face ecosystem",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    package_dir={"": "src"},
    packages=find_packages("src"),
    include_package_data=True,
    package_data={"rlcaption.hub.templates": ["*.md"]},
    python_requires=">=3.10",
    install_requires=[
        # torch is not pinned here: `make` installs a tested build first (CPU wheel by default)
        "torch>=2.1",
        "transformers>=5.0",
        "datasets>=3.0",
        "accelerate>=1.0",
        "evaluate>=0.4.3",
        "safetensors",
        "huggingface_hub>=1.0",
        "tokenizers",
        # LoRA adapters (`--use_peft`)
        "peft>=0.13",
        "numpy",
        "pillow",
        "tqdm",
    ],
    extras_require={
        "java": ["pycocoevalcap==1.2"],
        "plots": ["matplotlib"],
        # num2words: SmolVLM's processor needs it (tests/tiny_vlms.py builds one)
        "dev": [
            "pycocoevalcap==1.2",
            "pytest>=8",
            "pytest-xdist",
            "hypothesis",
            "ruff",
            "scipy",
            "matplotlib",
            "num2words",
            # tests/rewards/test_trl_rewards.py runs TRL's own reward functions
            "trl>=0.20",
        ],
    },
    entry_points={"console_scripts": ["rlcaption=rlcaption.cli:main"]},
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
