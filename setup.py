"""Installs the TPU-embedding recommender TFX components and pipelines.

Dependencies are pinned in requirements.lock (install with `make venv`); the ranges here are
what the code needs, so that a container built FROM the TFX 1.16 image can `pip install .`.
"""
from setuptools import find_packages, setup

setup(
    name="tpu-embedding-tfx",
    version="0.1.0",
    description="TFX components for recommendation models trained with TPU embeddings",
    python_requires=">=3.10,<3.11",
    packages=find_packages(include=["components", "components.*", "pipelines", "pipelines.*"]),
    package_data={"": ["*.yaml"]},
    install_requires=[
        "tfx>=1.16,<1.17",
        "tensorflow>=2.16,<2.17",
        "tf-keras>=2.16,<2.17",
        "tensorflow-recommenders>=0.7.7,<0.8",
        "apache-beam[gcp]>=2.59,<2.60",
        "pyyaml>=6",
    ],
    entry_points={"console_scripts": ["tpu-embedding-pipeline=pipelines.__main__:main"]},
)
