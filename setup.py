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
        # for its callback; Orbit is installed by scripts/_env.sh (its
        # package pins an older TensorFlow).
        "test": ["pytest", "pytest-xdist", "tensorboard",
                 "tf-keras; python_version >= '3.10'"],
    },
)
