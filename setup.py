"""Packaging for tf_distribute_lite."""

from setuptools import find_packages, setup

# Oldest TensorFlow release the test suite passes on (Keras 3 tests need 2.16).
MIN_TENSORFLOW = "2.14"

setup(
    name="tf_distribute_lite",
    version="0.1.0",
    description=(
        "A readable re-implementation of TensorFlow's tf.distribute API, "
        "layered on TensorFlow's own device placement, collective ops and tf.data."
    ),
    packages=find_packages(
        exclude=["tests", "tests.*", "benchmarks", "benchmarks.*", "examples", "examples.*"]
    ),
    python_requires=">=3.9",
    install_requires=[
        f"tensorflow>={MIN_TENSORFLOW}",
        "numpy",
        "absl-py",
    ],
    extras_require={
        # tf-keras (Keras 2) is tested as a client library, with TensorBoard
        # for its callback; Orbit and the Model Garden are installed by
        # scripts/_env.sh (their package pins an older TensorFlow).
        # The Model Garden's training framework (official.core and
        # official.modeling.multitask) imports gin and yaml, and
        # tensorflow_datasets, which scripts/_env.sh installs without its
        # dependencies (they include the 55 MB pyarrow, never used here): the
        # rest of the list is what importing tensorflow_datasets needs.
        "test": ["pytest", "pytest-xdist", "tensorboard",
                 "tf-keras; python_version >= '3.10'",
                 "gin-config", "pyyaml",
                 "etils", "immutabledict", "promise", "tensorflow-metadata",
                 "toml", "tqdm"],
    },
)
