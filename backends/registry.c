/*
 * The static table of backends compiled into this build, in probe order:
 * the cpu backend always, then each GPU backend whose build option and
 * dependencies were present (backends/CMakeLists.txt defines DSPK_HAVE_*).
 * Adding a backend means one extern line, one table line and its name in
 * dspk__known_backends here (see docs/backends.md).
 */
#include <signal.h>
#include <string.h>
#include "backends/backend.h"

extern const struct dspk__backend dspk__backend_cpu;
#ifdef DSPK_HAVE_CUDA
extern const struct dspk__backend dspk__backend_cuda;
#endif
#ifdef DSPK_HAVE_HIP
extern const struct dspk__backend dspk__backend_hip;
#endif
#ifdef DSPK_HAVE_VULKAN
extern const struct dspk__backend dspk__backend_vulkan;
#endif

const struct dspk__backend *const dspk__backends[] = {
    &dspk__backend_cpu,
#ifdef DSPK_HAVE_CUDA
    &dspk__backend_cuda,
#endif
#ifdef DSPK_HAVE_HIP
    &dspk__backend_hip,
#endif
#ifdef DSPK_HAVE_VULKAN
    &dspk__backend_vulkan,
#endif
    NULL,
};

/* Every backend dspk has, built into this binary or not: --backends accepts
 * these names (one this build lacks is listed as unavailable).  The
 * languages of raw kernels are the protocol's (proto/schema.c). */
const char *const dspk__known_backends[] = {"cpu", "cuda", "vulkan", "hip", NULL};

#ifdef DSPK_HAVE_VULKAN
int dspk__vk_compile_main(void); /* backends/vulkan/vk_shader.c */
int dspk__vk_trial_main(const char *spec); /* backends/vulkan/vk_shader.c */
int dspk__vk_spvval_main(const char *api); /* backends/vulkan/vk_spvval.c */
#endif
#ifdef DSPK_HAVE_CUDA
int dspk__cuda_compile_main(const char *arch); /* backends/cuda/backend.c */
#endif
#ifdef DSPK_HAVE_HIP
int dspk__hip_compile_main(const char *arch); /* backends/hip/backend.c */
#endif

/* See backend.h: the languages whose compiler runs in this process.  A
 * fault of the compiler or driver kills the process by its signal, as
 * kcompile.c reads it (ECOMPILE naming the signal), also in a sanitizer
 * build, whose handlers would turn it into a report and an abort (read as
 * running out of memory): this process exists to contain such a crash. */
int dspk__kernel_compile_main(const char *lang) {
  static const int fatal[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE};
  for (size_t i = 0; i < sizeof fatal / sizeof fatal[0]; i++)
    signal(fatal[i], SIG_DFL);
#ifdef DSPK_HAVE_VULKAN
  if (strcmp(lang, "glsl") == 0)
    return dspk__vk_compile_main();
  if (strncmp(lang, "vkpipe:", 7) == 0)
    return dspk__vk_trial_main(lang + 7);
  if (strncmp(lang, "spvval:", 7) == 0)
    return dspk__vk_spvval_main(lang + 7);
#endif
#ifdef DSPK_HAVE_CUDA
  if (strncmp(lang, "cuda:", 5) == 0)
    return dspk__cuda_compile_main(lang + 5);
#endif
#ifdef DSPK_HAVE_HIP
  if (strncmp(lang, "hip:", 4) == 0)
    return dspk__hip_compile_main(lang + 4);
#endif
  (void)lang;
  return 2;
}
