#!/usr/bin/env bash
# Builds the stand-in NVML library into OUT_DIR:
#   libnvidia-ml.so.<driver version> (soname libnvidia-ml.so.1), the link libnvidia-ml.so.1,
#   and the nvml_check program that exercises it.
# Usage: build.sh OUT_DIR [DRIVER_VERSION]   (DRIVER_VERSION defaults to 550.54.15; it must
# match the configuration's standin.driverVersion, which names the file the CDI specs mount).
set -euo pipefail
out=${1:?usage: build.sh OUT_DIR [DRIVER_VERSION]}
version=${2:-550.54.15}
here=$(cd "$(dirname "$0")" && pwd)
cc=${CC:-gcc}
mkdir -p "$out"
"$cc" -std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -Werror -fPIC -shared -fvisibility=hidden \
  -DSTANDIN_DRIVER_VERSION="\"$version\"" -Wl,-soname,libnvidia-ml.so.1 \
  -o "$out/libnvidia-ml.so.$version" "$here/nvml.c" -lpthread
ln -sfn "libnvidia-ml.so.$version" "$out/libnvidia-ml.so.1"
"$cc" -std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -Werror -o "$out/nvml_check" "$here/nvml_check.c" -ldl
echo "built $out/libnvidia-ml.so.$version, $out/libnvidia-ml.so.1, $out/nvml_check"
