#!/usr/bin/env bash
# The main job: set up, build, then train the tiny preset on text that Debian installs on every
# machine, and sample from the trained model. No arguments, no downloads beyond Debian packages.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
build/loom train --config configs/main.toml
build/loom generate --ckpt runs/main/checkpoints --prompt "The " --tokens 200
