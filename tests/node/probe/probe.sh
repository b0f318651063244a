#!/bin/sh
# What a container on a real node was given, printed once between markers for the tests to read
# from its log: its environment, its device nodes and its mounts. Then it waits to be stopped.
echo "probe: begin"
echo "probe: env"
env | sort | sed 's/^/  /'
echo "probe: devices"
ls -l /dev | sed 's/^/  /'
echo "probe: mounts"
sed 's/^/  /' /proc/self/mounts
echo "probe: end"
trap 'exit 0' TERM INT
while :; do sleep 1; done
