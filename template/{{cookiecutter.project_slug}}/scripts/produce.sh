#!/usr/bin/env bash
# Produces sample JSON order events (creating the topics if needed) to the broker that
# scripts/broker.sh started (its address is in .broker.json), or to --bootstrap-servers.
#   scripts/produce.sh --topics {{ cookiecutter.topics | replace(' ', '') }} --records 10000 [--bootstrap-servers HOST:PORT]
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
ARGS=("$@")
case " $* " in
  *" --bootstrap-servers"* | *" -h "* | *" --help "*) ;;
  *) ADDRESS="$(python -m {{ cookiecutter.package_name }}.devtools.broker address --state .broker.json)"
     ARGS=("$@" --bootstrap-servers "$ADDRESS") ;;
esac
exec python -m {{ cookiecutter.package_name }}.devtools.produce "${ARGS[@]}"
