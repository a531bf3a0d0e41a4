/*
 * What the GPU drivers' run-time loaders (backends/cuda/loader.c,
 * backends/hip/loader.c) share.  Inline: the driver tables are linked into
 * the kernel workers (backends/gpurt/worker.h) without the rest of the
 * runtime.
 */
#ifndef DSPK_BACKENDS_GPURT_LIBLOAD_H
#define DSPK_BACKENDS_GPURT_LIBLOAD_H

#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* A function of a library and where its pointer goes in the driver's
 * table: DSPK__GPURT_SYM(struct dspk__cu_api, cuInit). */
struct dspk__gpurt_sym {
  const char *name;
  size_t off;
};
#define DSPK__GPURT_SYM_STR(f) #f
#define DSPK__GPURT_SYM(api, f) {DSPK__GPURT_SYM_STR(f), offsetof(api, f)},

/* Fills the table tbl with the n functions of syms from lib.  Returns NULL,
 * or the name of the first function lib lacks. */
static inline const char *dspk__gpurt_resolve(void *lib, void *tbl,
                                              const struct dspk__gpurt_sym *syms, size_t n) {
  for (size_t i = 0; i < n; i++) {
    void *f = dlsym(lib, syms[i].name);
    if (!f)
      return syms[i].name;
    memcpy((char *)tbl + syms[i].off, &f, sizeof f);
  }
  return NULL;
}

/* What the load of one library found, remembered until the driver's
 * unload (done: tried; rc: 0 or a dspk_errno; why: the reason of a failure). */
struct dspk__gpurt_load {
  int done, rc;
  char why[200];
};

/* Fills the table tbl with the n functions of syms from lib.  Returns 0,
 * or -1 with "LIBNAME lacks FUNCTION" in s->why. */
static inline int dspk__gpurt_load_resolve(struct dspk__gpurt_load *s, void *lib,
                                           const char *libname, void *tbl,
                                           const struct dspk__gpurt_sym *syms, size_t n) {
  const char *missing = dspk__gpurt_resolve(lib, tbl, syms, n);
  if (missing)
    snprintf(s->why, sizeof(s->why), "%s lacks %s", libname, missing);
  return missing ? -1 : 0;
}

/* dspk__gpurt_load_resolve into the table tbl of size bytes, which a
 * failure leaves empty, lib closed. */
static inline int dspk__gpurt_load_table(struct dspk__gpurt_load *s, void *lib,
                                         const char *libname, void *tbl, size_t size,
                                         const struct dspk__gpurt_sym *syms, size_t n) {
  if (dspk__gpurt_load_resolve(s, lib, libname, tbl, syms, n) == 0)
    return 0;
  dlclose(lib);
  memset(tbl, 0, size);
  return -1;
}

/* The load's result for the caller: the reason of a failure in why (else ""). */
static inline void dspk__gpurt_load_why(const struct dspk__gpurt_load *s, char *why,
                                        size_t whylen) {
  if (why && whylen)
    snprintf(why, whylen, "%s", s->rc ? s->why : "");
}

#endif /* DSPK_BACKENDS_GPURT_LIBLOAD_H */
