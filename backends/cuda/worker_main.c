/*
 * dspk-cuda-worker: the kernel worker of the CUDA backend
 * (backends/gpurt/worker.h) over the CUDA driver table.
 */
#include "backends/cuda/cuda_internal.h"
#include "backends/gpurt/worker.h"

int main(int argc, char **argv) { return dspk__gpurt_worker_main(&dspk__gpurt_cuda, argc, argv); }
