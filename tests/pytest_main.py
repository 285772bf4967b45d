"""Entry point of every Bazel py_test: runs the given test file with pytest."""

import sys

import pytest

if __name__ == "__main__":
  sys.exit(pytest.main(["-q", *sys.argv[1:]]))
