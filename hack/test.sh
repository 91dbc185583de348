#!/usr/bin/env bash
# The project's test command (README "Quick start", and what .ci/run calls). On a fresh
# machine it installs everything the tests need, then runs every check and every test tier:
# lint, types, the layer contract, unit, integration (real Prometheus, real kube-apiserver)
# and e2e. Extra arguments go to pytest (e.g. `bash hack/test.sh tests/unit -x`).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*" >&2; }

step "Debian packages: prometheus and promtool"
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null
fi
prometheus --version 2>&1 | head -n 1 >&2

step "Python environment (.venv) with spectune and its test tools"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
export PATH="$PWD/.venv/bin:$PATH"

step "Kubernetes control plane, kwok and helm from Go modules (hack/cluster.sh build; cached)"
bash hack/cluster.sh build

step "ruff (lint and format)"
ruff check operator tests hack benchmarks
ruff format --check operator tests hack benchmarks

step "mypy --strict"
mypy
mypy benchmarks  # the scripts behind the closing notes: an API change must not break them unseen

step "import-linter layer contracts"
lint-imports

step "generated files are current (chart values table, dashboard, CRD)"
python hack/chart-readme.py --check
python hack/dashboard.py --check
python hack/install-manifest.py --check  # deploy/install.yaml is the chart's helm template
spectune crd | diff -u crds/spectune.io_spectunings.yaml - >/dev/null \
  || { echo "crds/ is stale: run spectune crd --out crds/spectune.io_spectunings.yaml" >&2; exit 1; }

step "pytest: every tier"
pytest "$@"
