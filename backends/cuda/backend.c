/*
 * The CUDA backend's table (backends/backend.h): the shared GPU runtime
 * (backends/gpurt/) over the CUDA driver table of cuda.c.
 */
#include "backends/cuda/cuda_internal.h"

static int cuda_probe(struct dspk__devinfo *info, int max, char *why, size_t whylen) {
  return dspk__gpurt_probe(&dspk__gpurt_cuda, info, max, why, whylen);
}
static void cuda_shutdown(void) { dspk__gpurt_shutdown(&dspk__gpurt_cuda); }
static int cuda_open(int index, const struct dspk__devenv *env, struct dspk__dev **out) {
  return dspk__gpurt_open(&dspk__gpurt_cuda, index, env, out);
}

const struct dspk__backend dspk__backend_cuda = {
    .name = "cuda",
    .probe = cuda_probe,
    .shutdown = cuda_shutdown,
    .open = cuda_open,
    DSPK__GPURT_BACKEND_MEMBERS,
};

/* `dspkd --kernel-compile cuda:ARCH` (backends/registry.c): NVRTC on a
 * client's source in a child under limits (backends/common/kcompile.h). */
int dspk__cuda_compile_main(const char *arch);
int dspk__cuda_compile_main(const char *arch) {
  return dspk__gpurt_compile_main(&dspk__gpurt_cuda, arch);
}
