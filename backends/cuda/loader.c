/*
 * Run-time loading of the CUDA libraries (see cuda_api.h).  Each library is
 * looked for under its sonames, newest first, in the dynamic linker's path,
 * then in DSPK_CUDA_LIBDIR, /usr/local/cuda/lib64 and
 * /usr/local/cuda/targets/x86_64-linux/lib (the driver's libcuda.so.1 in
 * the linker's path alone: dspk__cuda_load_driver).  A library that
 * cannot be opened or lacks a symbol leaves its table empty and reports why;
 * the result is remembered so later calls cost nothing.
 */
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda_api.h"
#include "backends/gpurt/libload.h"
#include "dspk/errors.h"
#include "proto/testhook.h"

struct dspk__cu_api dspk__cu;
struct dspk__nvrtc_api dspk__nvrtc;
struct dspk__cublas_api dspk__cublas;
struct dspk__cufft_api dspk__cufft;

/* What each load found, remembered until dspk__cuda_unload. */
static struct {
  struct dspk__gpurt_load cu, nvrtc, cublas, cufft;
} st;

static void *open_one(const char *const *names, char *tried, size_t len) {
  static const char *const dirs[] = {NULL, "$", "/usr/local/cuda/lib64",
                                     "/usr/local/cuda/targets/x86_64-linux/lib"};
  void *h = dspk__gpurt_dlopen_first(dirs, sizeof(dirs) / sizeof(dirs[0]),
                                     "DSPK_CUDA_LIBDIR", names);
  tried[0] = 0;
  if (!h)
    snprintf(tried, len, "%s not found", names[0]);
  return h;
}

#define SYM(api, f) DSPK__GPURT_SYM(struct api, f)
static const struct dspk__gpurt_sym cu_syms[] = {
#define XX(f) SYM(dspk__cu_api, f)
    DSPK__CU_FUNCS(XX)
#undef XX
};
static const struct dspk__gpurt_sym nvrtc_syms[] = {
#define XX(f) SYM(dspk__nvrtc_api, f)
    DSPK__NVRTC_FUNCS(XX)
#undef XX
};
static const struct dspk__gpurt_sym cublas_syms[] = {
#define XX(f) SYM(dspk__cublas_api, f)
    DSPK__CUBLAS_FUNCS(XX)
#undef XX
};
static const struct dspk__gpurt_sym cufft_syms[] = {
#define XX(f) SYM(dspk__cufft_api, f)
    DSPK__CUFFT_FUNCS(XX)
#undef XX
};
#define NSYMS(a) (sizeof(a) / sizeof(a[0]))

/* Opens the first library of names found and fills its table tbl (size
 * bytes, the handle in *lib).  Returns 0, or DSPK_ENOTSUP with the table
 * empty and the reason in s->why. */
static int load_table(struct dspk__gpurt_load *s, const char *const *names,
                      const char *libname, void *tbl, size_t size, void **lib,
                      const struct dspk__gpurt_sym *syms, size_t n) {
  *lib = open_one(names, s->why, sizeof(s->why));
  if (!*lib || dspk__gpurt_load_table(s, *lib, libname, tbl, size, syms, n) != 0)
    return DSPK_ENOTSUP;
  return 0;
}

int dspk__cuda_load_driver(char *why, size_t whylen) {
  struct dspk__gpurt_load *s = &st.cu;
  const char *libname = "libcuda.so.1";
  if (!s->done) {
    const char *over = DSPK_TEST_HOOK("DSPK_CUDA_DRIVER");
    s->done = 1;
    s->rc = 0;
    if (over && *over) {
      libname = over;
      dspk__cu.lib = dlopen(over, RTLD_NOW | RTLD_LOCAL);
    } else {
      dspk__cu.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    }
    if (!dspk__cu.lib) {
      snprintf(s->why, sizeof(s->why), "%s not found (no NVIDIA driver)",
               libname);
      s->rc = DSPK_ENODEV;
      goto out;
    }
    if (dspk__gpurt_load_table(s, dspk__cu.lib, libname, &dspk__cu, sizeof(dspk__cu), cu_syms,
                               NSYMS(cu_syms)) != 0)
      s->rc = DSPK_ENODEV;
  }
out:
  dspk__gpurt_load_why(s, why, whylen);
  return s->rc;
}

int dspk__cuda_load_nvrtc(char *why, size_t whylen) {
  static const char *const names[] = {"libnvrtc.so.13", "libnvrtc.so.12",
                                      "libnvrtc.so", NULL};
  struct dspk__gpurt_load *s = &st.nvrtc;
  if (!s->done) {
    s->done = 1;
    s->rc = load_table(s, names, "libnvrtc", &dspk__nvrtc, sizeof(dspk__nvrtc), &dspk__nvrtc.lib,
                       nvrtc_syms, NSYMS(nvrtc_syms));
    if (s->rc == 0 &&
        dspk__nvrtc.nvrtcVersion(&dspk__nvrtc.major, &dspk__nvrtc.minor) != NVRTC_SUCCESS) {
      snprintf(s->why, sizeof(s->why), "nvrtcVersion failed");
      dlclose(dspk__nvrtc.lib);
      memset(&dspk__nvrtc, 0, sizeof(dspk__nvrtc));
      s->rc = DSPK_ENOTSUP;
    }
  }
  dspk__gpurt_load_why(s, why, whylen);
  return s->rc;
}

int dspk__cuda_load_cublas(char *why, size_t whylen) {
  static const char *const names[] = {"libcublas.so.13", "libcublas.so.12",
                                      "libcublas.so", NULL};
  struct dspk__gpurt_load *s = &st.cublas;
  if (!s->done) {
    s->done = 1;
    s->rc = load_table(s, names, "libcublas", &dspk__cublas, sizeof(dspk__cublas),
                       &dspk__cublas.lib, cublas_syms, NSYMS(cublas_syms));
  }
  dspk__gpurt_load_why(s, why, whylen);
  return s->rc;
}

int dspk__cuda_load_cufft(char *why, size_t whylen) {
  static const char *const names[] = {"libcufft.so.12", "libcufft.so.11",
                                      "libcufft.so", NULL};
  struct dspk__gpurt_load *s = &st.cufft;
  if (!s->done) {
    s->done = 1;
    s->rc = load_table(s, names, "libcufft", &dspk__cufft, sizeof(dspk__cufft), &dspk__cufft.lib,
                       cufft_syms, NSYMS(cufft_syms));
  }
  dspk__gpurt_load_why(s, why, whylen);
  return s->rc;
}

void dspk__cuda_unload(void) {
  /* The libraries stay mapped: cuBLAS and cuFFT carry a static CUDA runtime
   * that registers exit handlers, and libcuda keeps threads of its own, so
   * dlclose() before exit invites crashes at exit.  Only the tables and the
   * remembered results are reset (a later load dlopens again, which just
   * takes another reference). */
  memset(&dspk__cufft, 0, sizeof(dspk__cufft));
  memset(&dspk__cublas, 0, sizeof(dspk__cublas));
  memset(&dspk__nvrtc, 0, sizeof(dspk__nvrtc));
  memset(&dspk__cu, 0, sizeof(dspk__cu));
  memset(&st, 0, sizeof(st));
}
