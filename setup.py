"""gs_horovod: global-sketching SGD (gs-SGD) gradient compression for Horovod."""

from pathlib import Path

from setuptools import find_packages, setup

README = Path(__file__).with_name("README.md")

setup(
    name="gs_horovod",
    version="0.1.0",
    description=("gs-SGD: global top-k gradient compression with error feedback (exact sparse exchanges, "
                 "or the paper's Count-Sketch) for Horovod and torch.distributed"),
    long_description=README.read_text(encoding="utf-8") if README.exists() else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    packages=find_packages(include=["gs_horovod", "gs_horovod.*"]),
    install_requires=["numpy>=1.23", "numba>=0.60"],
    extras_require={
        "torch": ["torch>=2.0", "horovod==0.28.1"],
        "tensorflow": ["tensorflow>=2.15", "horovod==0.28.1"],
        "mpi": ["mpi4py>=4"],
        "cuda": ["numba-cuda"],
        "examples": ["scikit-learn", "tqdm"],
    },
)
