#!/bin/sh
# run_mpi.sh MPIEXEC NP PROGRAM [ARGS...]: run PROGRAM on NP ranks; exit 77
# (skipped) when MPIEXEC is missing. Open MPI gets --oversubscribe (the test
# machines have fewer cores than ranks) and, as root, --allow-run-as-root;
# ZO_MPIEXEC_FLAGS adds more.
mpiexec="$1"; np="$2"; shift 2
if [ -z "$mpiexec" ] || ! command -v "$mpiexec" >/dev/null 2>&1; then
    echo "skipped: mpiexec not found"
    exit 77
fi
flags=""
if "$mpiexec" --version 2>&1 | grep -qiE "open ?mpi|openrte"; then
    flags="--oversubscribe"
    [ "$(id -u)" = 0 ] && flags="$flags --allow-run-as-root"
fi
# shellcheck disable=SC2086
exec "$mpiexec" $flags $ZO_MPIEXEC_FLAGS -np "$np" "$@"
