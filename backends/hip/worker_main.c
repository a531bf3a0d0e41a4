/*
 * dspk-hip-worker: the kernel worker of the HIP backend
 * (backends/gpurt/worker.h) over the HIP driver table.
 */
#include "backends/gpurt/worker.h"
#include "backends/hip/hip_internal.h"

int main(int argc, char **argv) { return dspk__gpurt_worker_main(&dspk__gpurt_hip, argc, argv); }
