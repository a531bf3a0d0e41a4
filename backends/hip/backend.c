/*
 * The HIP backend's table (backends/backend.h): the shared GPU runtime
 * (backends/gpurt/) over the HIP driver table of hip.c.
 */
#include "backends/hip/hip_internal.h"

static int hip_probe(struct dspk__devinfo *info, int max, char *why, size_t whylen) {
  return dspk__gpurt_probe(&dspk__gpurt_hip, info, max, why, whylen);
}
static void hip_shutdown(void) { dspk__gpurt_shutdown(&dspk__gpurt_hip); }
static int hip_open(int index, const struct dspk__devenv *env, struct dspk__dev **out) {
  return dspk__gpurt_open(&dspk__gpurt_hip, index, env, out);
}

const struct dspk__backend dspk__backend_hip = {
    .name = "hip",
    .probe = hip_probe,
    .shutdown = hip_shutdown,
    .open = hip_open,
    DSPK__GPURT_BACKEND_MEMBERS,
};

/* `dspkd --kernel-compile hip:ARCH` (backends/registry.c): hiprtc on a
 * client's source in a child under limits (backends/common/kcompile.h). */
int dspk__hip_compile_main(const char *arch);
int dspk__hip_compile_main(const char *arch) {
  return dspk__gpurt_compile_main(&dspk__gpurt_hip, arch);
}
