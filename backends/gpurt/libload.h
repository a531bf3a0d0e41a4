/*
 * What the GPU drivers' run-time loaders (backends/cuda/loader.c,
 * backends/hip/loader.c) share.  Inline: the driver tables are linked into
 * the kernel workers (backends/gpurt/worker.h) without the rest of the
 * runtime.
 */
#ifndef DSPK_BACKENDS_GPURT_LIBLOAD_H
#define DSPK_BACKENDS_GPURT_LIBLOAD_H

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

/* Opens the first library of names (sonames, NULL-terminated, newest
 * first) found in the first directory of dirs that has one: NULL stands
 * for the dynamic linker's path, "$" for the directory named by the
 * environment variable env (passed over when it is unset or empty).
 * Returns the dlopen handle, or NULL when none opens. */
static inline void *dspk__gpurt_dlopen_first(const char *const *dirs, size_t ndirs,
                                             const char *env, const char *const *names) {
  const char *envdir = getenv(env);
  for (size_t d = 0; d < ndirs; d++) {
    const char *dir = dirs[d];
    if (dir && dir[0] == '$') {
      if (!envdir || !*envdir)
        continue;
      dir = envdir;
    }
    for (size_t i = 0; names[i]; i++) {
      char path[512];
      void *h;
      if (dir)
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
      else
        snprintf(path, sizeof(path), "%s", names[i]);
      h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
      if (h)
        return h;
    }
  }
  return NULL;
}

#endif /* DSPK_BACKENDS_GPURT_LIBLOAD_H */
