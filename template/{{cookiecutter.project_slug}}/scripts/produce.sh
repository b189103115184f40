#!/usr/bin/env bash
# Produces sample order events (creating the topics if needed) to the broker that
# scripts/broker.sh started (its address is in .broker.json), or to --bootstrap-servers.
#   scripts/produce.sh --topics {{ cookiecutter.topics | replace(' ', '') }} --records 10000 [--bootstrap-servers HOST:PORT]
#   scripts/produce.sh --topics ... --format avro|protobuf [--evolve] [--registry-url URL]
# --format {{ cookiecutter.value_format }} is this project's default (decoding.value.format in conf/).
# json writes plain JSON; avro and protobuf write Confluent's wire format
# with confluent-kafka's serializers against the Schema Registry scripts/broker.sh started (its
# URL is in .broker.json too), or --registry-url. --evolve switches to the schema's second
# version (an added optional field, channel) halfway through.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
BROKER=(python -m kafka_delta_dev.broker)
ARGS=("$@")
case " $* " in
  *" --format"*) ;;
  *) ARGS+=(--format {{ cookiecutter.value_format }})
     set -- "$@" --format {{ cookiecutter.value_format }} ;;
esac
case " $* " in
  *" --bootstrap-servers"* | *" -h "* | *" --help "* | *" --write-descriptor-set"*) ;;
  *) ADDRESS="$("${BROKER[@]}" address --state .broker.json)"
     ARGS+=(--bootstrap-servers "$ADDRESS") ;;
esac
case " $* " in
  *" --registry-url"* | *" -h "* | *" --help "*) ;;
  *" --format avro "* | *" --format protobuf "* | *" --format=avro "* | *" --format=protobuf "*)
     REGISTRY="$("${BROKER[@]}" registry-url --state .broker.json)"
     ARGS+=(--registry-url "$REGISTRY") ;;
esac
exec python -m kafka_delta_dev.produce "${ARGS[@]}"
