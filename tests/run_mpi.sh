#!/bin/sh
# run_mpi.sh MPIEXEC NP PROGRAM [ARGS...]: run PROGRAM on NP ranks; exit 77
# (skipped) when MPIEXEC is missing. Open MPI gets --oversubscribe (the test
# machines have fewer cores than ranks) and, as root, --allow-run-as-root;
# ZO_MPIEXEC_FLAGS adds more. Open MPI is told its ranks share this host.
# The exit status is the job's.
mpiexec="$1"; np="$2"; shift 2
if [ -z "$mpiexec" ] || ! command -v "$mpiexec" >/dev/null 2>&1; then
    echo "skipped: mpiexec not found"
    exit 77
fi
flags=""
if "$mpiexec" --version 2>&1 | grep -qiE "open ?mpi|openrte"; then
    flags="--oversubscribe"
    [ "$(id -u)" = 0 ] && flags="$flags --allow-run-as-root"
    # Every rank is on this host: shared memory (the vader BTL under the ob1
    # PML). Left to choose, Open MPI first probes the network PMLs (UCX,
    # libfabric, PSM): 0.36 s against 0.13 s for a 2-rank job's start and
    # end, a third of test_ranks_moe_ep_zero's 31 s (docs/testing.md). An
    # OMPI_MCA_pml or OMPI_MCA_btl already set is kept.
    export OMPI_MCA_pml="${OMPI_MCA_pml:-ob1}" OMPI_MCA_btl="${OMPI_MCA_btl:-self,vader}"
    # Nor does mpiexec or a rank read the PCI devices (hwloc's I/O discovery,
    # for placing ranks near network cards; none are used): reading PCI
    # config space was 13% of a 4-rank job's start; 0.264 -> 0.213 s for a
    # bare 4-rank MPI_Init/Finalize job, 0.169 -> 0.148 s on 2 ranks. A
    # HWLOC_COMPONENTS already set is kept.
    export HWLOC_COMPONENTS="${HWLOC_COMPONENTS:--pci,-linuxio}"
fi
# Each job its own TMPDIR, removed after it: Open MPI makes its session
# folder there, and two jobs starting at once beside each other (two suites,
# two engineers' tests) could fail creating a shared one ("File exists").
dir=$(mktemp -d "${TMPDIR:-/tmp}/zo-mpi.XXXXXX") || exit 1
# shellcheck disable=SC2086
TMPDIR="$dir" "$mpiexec" $flags $ZO_MPIEXEC_FLAGS -np "$np" "$@"
rc=$?
rm -rf "$dir"
exit $rc
