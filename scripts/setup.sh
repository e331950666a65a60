#!/usr/bin/env bash
# Installs every Debian package Loom needs to build, test and run its main job.
# Safe to re-run: packages already present are skipped without touching the network.
set -euo pipefail

PACKAGES=(
  # toolchain
  build-essential cmake ninja-build ccache pkg-config
  # trainer core: fp32 GEMMs (OpenBLAS), bf16 GEMMs on AVX512-BF16 CPUs (oneDNN), configs (toml++)
  libopenblas-openmp-dev libdnnl-dev libtomlplusplus-dev
  # loom serve: its event-driven HTTP server (Boost.Asio/Beast), the HTTP client of bench serve
  # and RL's environments (cpp-httplib), and curl, which the main job uses to query it
  libboost-dev libcpp-httplib-dev curl
  # fuzz targets (libFuzzer) and the sanitizer build
  clang libclang-rt-dev
  # tests: python3-jinja2 renders chat templates as Hugging Face does, python3-torch runs the
  # reference forward of the Hugging Face families (tests/ckpt/hf_reference.py); both for /usr/bin/python3
  libgtest-dev python3-jinja2 python3-torch
  # multi-process runs
  openmpi-bin libopenmpi-dev
  # the main job's corpus: the Python documentation as HTML
  python3-doc
  # loom curate (optional): gzip/zstd input, Unicode, HTML parsing, language ID
  zlib1g-dev libzstd-dev libutf8proc-dev libgumbo-dev libcld2-dev
  # tokenizer.json Split regexes beyond Loom's own scanners (DeepSeek V3's)
  libpcre2-dev
  # SentencePiece tokenizer.model files (libsentencepiece-dev, optional); the tests' reference on
  # them (python3-sentencepiece) and the trainer of their fixtures (sentencepiece: spm_train)
  libsentencepiece-dev python3-sentencepiece sentencepiece
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
