#!/usr/bin/env bash
# Produces sample JSON order events (creating the topics if needed).
#   scripts/produce.sh --bootstrap-servers 127.0.0.1:9092 --topics {{ cookiecutter.topics | replace(' ', '') }} --records 10000
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" exec python -m {{ cookiecutter.package_name }}.devtools.produce "$@"
