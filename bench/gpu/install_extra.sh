#!/usr/bin/env bash
# ON THE GPU MACHINE, from the repo root: the gateway's runtime packages into /tmp/site2 (on PYTHONPATH in the
# run scripts). prepare_regress_pack.sh ships them installed and xz-compressed (.gpu/site2.tar.xz: 6 MB less to
# carry than the wheels, whose zip deflate xz cannot shrink); an older pack's wheels (.gpu/extra/*.whl) still work.
set -uo pipefail
if [[ -f .gpu/site2.tar.xz ]]; then
  [[ -d /tmp/site2 ]] || tar -xJf .gpu/site2.tar.xz -C /tmp
else
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site2 .gpu/extra/*.whl "$@" > /dev/null 2>&1
fi
