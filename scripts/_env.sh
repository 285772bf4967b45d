# Shared setup for scripts/demo and scripts/test; sourced, not run.
#
# Moves to the repository root, creates .venv on first use and installs the
# project into it with its test extras. The install is redone only when
# setup.py or the pins installed without dependencies change: .venv/.install-stamp
# holds a hash of them from the last successful install.
#
# Test dependencies: tf-keras, and what the Model Garden's training framework
# imports, come from setup.py's test extras. Installed without dependencies:
# Orbit and the Model Garden (`official`), from tf-models-no-deps, whose
# metadata pins an older TensorFlow (Orbit itself needs only TensorFlow,
# tf-keras, absl and numpy); tensorflow-datasets, which `official.core`
# imports but the tests never use, so its heavy dependencies are left out
# (setup.py lists the few its import needs).
#
# Environment:
#   PYTHON                interpreter used to create .venv (default: python3)
#   TF_CPP_MIN_LOG_LEVEL  TensorFlow C++ log level (scripts/test: 2 unless set).
#                         Left unset, scripts/demo's example starts TensorFlow
#                         without its start-up log lines, which no log level
#                         silences (examples/_quiet_tensorflow.py).

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"

VENV_DIR="$REPO_ROOT/.venv"
VENV_PYTHON="$VENV_DIR/bin/python"
STAMP_FILE="$VENV_DIR/.install-stamp"
NO_DEPS_PACKAGES=(tf-models-no-deps==2.19.0 tensorflow-datasets==4.9.10)

_say() { echo "[$(basename "$0")] $*" >&2; }

# A venv whose base interpreter has gone away cannot be repaired; rebuild it.
if [[ -d "$VENV_DIR" ]] && ! "$VENV_PYTHON" -c "" >/dev/null 2>&1; then
  _say "removing broken .venv"
  rm -rf "$VENV_DIR"
fi

if [[ ! -d "$VENV_DIR" ]]; then
  _say "creating .venv with ${PYTHON:-python3}"
  command -v "${PYTHON:-python3}" >/dev/null || {
    _say "error: ${PYTHON:-python3} not found; install Python 3.9+ or set PYTHON"
    exit 1
  }
  "${PYTHON:-python3}" -c 'import sys; sys.exit(sys.version_info < (3, 9))' || {
    _say "error: Python 3.9 or newer is required"
    exit 1
  }
  if ! { "${PYTHON:-python3}" -m venv "$VENV_DIR" &&
         "$VENV_PYTHON" -m pip install -q --disable-pip-version-check --upgrade pip; }; then
    rm -rf "$VENV_DIR"
    _say "error: could not create .venv (on Debian/Ubuntu: apt install python3-venv)"
    exit 1
  fi
fi

_setup_hash="$("$VENV_PYTHON" -c '
import hashlib, sys
print(hashlib.sha256(open("setup.py", "rb").read() + sys.argv[1].encode()).hexdigest())
' "${NO_DEPS_PACKAGES[*]}")"

if [[ ! -f "$STAMP_FILE" || "$(cat "$STAMP_FILE")" != "$_setup_hash" ]]; then
  _say "installing tf_distribute_lite and its dependencies into .venv (first run downloads TensorFlow)"
  rm -f "$STAMP_FILE"
  # Build-backend chatter goes to a log, shown only if the install fails.
  if ! { "$VENV_PYTHON" -m pip install -q --disable-pip-version-check -e ".[test]" &&
         "$VENV_PYTHON" -m pip install -q --disable-pip-version-check --no-deps "${NO_DEPS_PACKAGES[@]}"; } \
      > "$VENV_DIR/install.log" 2>&1; then
    cat "$VENV_DIR/install.log" >&2
    _say "error: installation failed (log: .venv/install.log)"
    exit 1
  fi
  echo "$_setup_hash" > "$STAMP_FILE"
fi
unset _setup_hash
