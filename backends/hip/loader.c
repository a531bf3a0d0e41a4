/*
 * Run-time loading of the HIP libraries (see hip_api.h).  Each library is
 * looked for under its sonames, newest first, in DSPK_HIP_LIBDIR, the
 * dynamic linker's path and /opt/rocm/lib.  A library that cannot be
 * opened or lacks a symbol leaves its table empty and reports why; the
 * result is remembered so later calls cost nothing.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/gpurt/libload.h"
#include "backends/hip/hip_api.h"
#include "dspk/errors.h"
#include "proto/testhook.h"

struct dspk__hip_api dspk__hip;
struct dspk__hiprtc_api dspk__hiprtc;
struct dspk__hipblas_api dspk__hipblas;
struct dspk__hipfft_api dspk__hipfft;

/* What each load found, remembered until dspk__hip_unload. */
static struct {
  struct dspk__gpurt_load rt, rtc, blas, fft;
} st;

static void *open_one(const char *const *names, const char *what, char *why, size_t len) {
  static const char *const dirs[] = {"$", NULL, "/opt/rocm/lib"};
  void *h = dspk__gpurt_dlopen_first(dirs, sizeof(dirs) / sizeof(dirs[0]), "DSPK_HIP_LIBDIR",
                                     names);
  if (!h)
    snprintf(why, len, "%s not found (%s)", names[0], what);
  return h;
}

/* The path an override test hook (proto/testhook.h) gives: NULL when
 * unset, "" for "none". */
static const char *override(const char *s) {
  if (!s || !*s)
    return NULL;
  return strcmp(s, "none") == 0 ? "" : s;
}

static const struct dspk__gpurt_sym hip_syms[] = {
#define XX(f) DSPK__GPURT_SYM(struct dspk__hip_api, f)
    DSPK__HIP_FUNCS(XX)
#undef XX
};
static const struct dspk__gpurt_sym hiprtc_syms[] = {
#define XX(f) DSPK__GPURT_SYM(struct dspk__hiprtc_api, f)
    DSPK__HIPRTC_FUNCS(XX)
#undef XX
};
#define NSYMS(a) (sizeof(a) / sizeof(a[0]))

int dspk__hip_load_runtime(char *why, size_t whylen) {
  static const char *const names[] = {"libamdhip64.so.6", "libamdhip64.so.5",
                                      "libamdhip64.so", NULL};
  struct dspk__gpurt_load *s = &st.rt;
  const char *over = override(DSPK_TEST_HOOK("DSPK_HIP_RUNTIME"));
  const char *libname = over && *over ? over : "libamdhip64";
  if (!s->done) {
    s->done = 1;
    s->rc = 0;
    if (over) {
      dspk__hip.lib = *over ? dlopen(over, RTLD_NOW | RTLD_LOCAL) : NULL;
      if (!dspk__hip.lib)
        snprintf(s->why, sizeof(s->why), "%s not found (no HIP runtime)",
                 *over ? over : "libamdhip64");
    } else {
      dspk__hip.lib = open_one(names, "no HIP runtime: ROCm is not installed", s->why,
                               sizeof(s->why));
    }
    if (!dspk__hip.lib) {
      s->rc = DSPK_ENODEV;
      goto out;
    }
    if (dspk__gpurt_load_table(s, dspk__hip.lib, libname, &dspk__hip, sizeof(dspk__hip),
                               hip_syms, NSYMS(hip_syms)) != 0)
      s->rc = DSPK_ENODEV;
  }
out:
  dspk__gpurt_load_why(s, why, whylen);
  return s->rc;
}

int dspk__hip_load_hiprtc(char *why, size_t whylen) {
  static const char *const names[] = {"libhiprtc.so.7", "libhiprtc.so.6", "libhiprtc.so",
                                      NULL};
  struct dspk__gpurt_load *s = &st.rtc;
  const char *libname = "hiprtc";
  if (!s->done) {
    s->done = 1;
    s->rc = 0;
    if (dspk__hip_load_runtime(s->why, sizeof(s->why)) != 0) {
      s->rc = DSPK_ENOTSUP;
      goto out;
    }
    /* ROCm 5: hiprtc lives in the runtime library itself. */
    if (dlsym(dspk__hip.lib, "hiprtcCompileProgram")) {
      dspk__hiprtc.lib = dspk__hip.lib;
      libname = "libamdhip64";
    } else {
      dspk__hiprtc.lib = open_one(names, "hiprtc", s->why, sizeof(s->why));
      libname = "libhiprtc";
    }
    if (!dspk__hiprtc.lib) {
      s->rc = DSPK_ENOTSUP;
      goto out;
    }
    if (dspk__gpurt_load_resolve(s, dspk__hiprtc.lib, libname, &dspk__hiprtc, hiprtc_syms,
                                 NSYMS(hiprtc_syms)) != 0)
      goto fail;
    if (dspk__hiprtc.hiprtcVersion(&dspk__hiprtc.major, &dspk__hiprtc.minor) !=
        HIPRTC_SUCCESS) {
      snprintf(s->why, sizeof(s->why), "hiprtcVersion failed");
      goto fail;
    }
    goto out;
  fail:
    memset(&dspk__hiprtc, 0, sizeof(dspk__hiprtc));
    s->rc = DSPK_ENOTSUP;
  }
out:
  dspk__gpurt_load_why(s, why, whylen);
  return s->rc;
}

/* hipBLAS first, then rocBLAS: the same entry points under two naming
 * schemes. */
static const struct {
  const char *name, *const *sonames;
  const char *sym[10];
} blas_libs[] = {
    {"hipBLAS", (const char *const[]){"libhipblas.so.3", "libhipblas.so.2", "libhipblas.so.1",
                                      "libhipblas.so.0", "libhipblas.so", NULL},
     {"hipblasCreate", "hipblasDestroy", "hipblasSetStream", "hipblasSgemm", "hipblasDgemm",
      "hipblasSgemmStridedBatched", "hipblasDgemmStridedBatched", "hipblasCgemmStridedBatched",
      "hipblasZgemmStridedBatched", NULL}},
    {"rocBLAS", (const char *const[]){"librocblas.so.5", "librocblas.so.4", "librocblas.so.3",
                                      "librocblas.so.0", "librocblas.so", NULL},
     {"rocblas_create_handle", "rocblas_destroy_handle", "rocblas_set_stream",
      "rocblas_sgemm", "rocblas_dgemm", "rocblas_sgemm_strided_batched",
      "rocblas_dgemm_strided_batched", "rocblas_cgemm_strided_batched",
      "rocblas_zgemm_strided_batched", NULL}},
};

int dspk__hip_load_blas(char *why, size_t whylen) {
  struct dspk__gpurt_load *s = &st.blas;
  if (!s->done) {
    const char *over = override(DSPK_TEST_HOOK("DSPK_HIP_BLAS"));
    s->done = 1;
    s->rc = DSPK_ENOTSUP;
    snprintf(s->why, sizeof(s->why), "neither hipBLAS nor rocBLAS found");
    if (over && !*over) {
      snprintf(s->why, sizeof(s->why), "BLAS disabled (test hook: none)");
      goto out;
    }
    for (size_t l = 0; l < sizeof(blas_libs) / sizeof(blas_libs[0]) && s->rc; l++) {
      char tmp[200];
      void *lib, *f[9];
      int ok = 1;
      if (over) {
        lib = dlopen(over, RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
          snprintf(s->why, sizeof(s->why), "%s not found", over);
          goto out;
        }
      } else if (!(lib = open_one(blas_libs[l].sonames, "BLAS", tmp, sizeof(tmp)))) {
        continue;
      }
      for (int i = 0; i < 9 && ok; i++)
        if (!(f[i] = dlsym(lib, blas_libs[l].sym[i]))) {
          snprintf(s->why, sizeof(s->why), "%s lacks %s", blas_libs[l].name,
                   blas_libs[l].sym[i]);
          ok = 0;
        }
      if (!ok) {
        dlclose(lib);
        continue;
      }
      dspk__hipblas.lib = lib;
      dspk__hipblas.name = blas_libs[l].name;
      *(void **)&dspk__hipblas.create = f[0];
      *(void **)&dspk__hipblas.destroy = f[1];
      *(void **)&dspk__hipblas.set_stream = f[2];
      *(void **)&dspk__hipblas.sgemm = f[3];
      *(void **)&dspk__hipblas.dgemm = f[4];
      *(void **)&dspk__hipblas.sgemm_sb = f[5];
      *(void **)&dspk__hipblas.dgemm_sb = f[6];
      *(void **)&dspk__hipblas.cgemm_sb = f[7];
      *(void **)&dspk__hipblas.zgemm_sb = f[8];
      s->rc = 0;
    }
  }
out:
  dspk__gpurt_load_why(s, why, whylen);
  return s->rc;
}

int dspk__hip_load_fft(char *why, size_t whylen) {
  static const char *const names[] = {"libhipfft.so.1", "libhipfft.so.0", "libhipfft.so",
                                      NULL};
  static const char *const sym[] = {
      "hipfftCreate",       "hipfftDestroy",       "hipfftSetAutoAllocation",
      "hipfftMakePlanMany64", "hipfftSetWorkArea", "hipfftSetStream",
      "hipfftExecC2C",      "hipfftExecZ2Z",       "hipfftExecR2C",
      "hipfftExecD2Z",      "hipfftExecC2R",       "hipfftExecZ2D"};
  struct dspk__gpurt_load *s = &st.fft;
  if (!s->done) {
    const char *over = override(DSPK_TEST_HOOK("DSPK_HIP_FFT"));
    void *lib, *f[12];
    s->done = 1;
    s->rc = DSPK_ENOTSUP;
    if (over && !*over) {
      snprintf(s->why, sizeof(s->why), "FFT disabled (test hook: none)");
      goto out;
    }
    lib = over ? dlopen(over, RTLD_NOW | RTLD_LOCAL)
               : open_one(names, "hipFFT", s->why, sizeof(s->why));
    if (!lib) {
      if (over)
        snprintf(s->why, sizeof(s->why), "%s not found", over);
      goto out;
    }
    for (int i = 0; i < 12; i++)
      if (!(f[i] = dlsym(lib, sym[i]))) {
        snprintf(s->why, sizeof(s->why), "hipFFT lacks %s", sym[i]);
        dlclose(lib);
        goto out;
      }
    dspk__hipfft.lib = lib;
    *(void **)&dspk__hipfft.create = f[0];
    *(void **)&dspk__hipfft.destroy = f[1];
    *(void **)&dspk__hipfft.set_auto_allocation = f[2];
    *(void **)&dspk__hipfft.make_plan_many64 = f[3];
    *(void **)&dspk__hipfft.set_work_area = f[4];
    *(void **)&dspk__hipfft.set_stream = f[5];
    *(void **)&dspk__hipfft.exec_c2c = f[6];
    *(void **)&dspk__hipfft.exec_z2z = f[7];
    *(void **)&dspk__hipfft.exec_r2c = f[8];
    *(void **)&dspk__hipfft.exec_d2z = f[9];
    *(void **)&dspk__hipfft.exec_c2r = f[10];
    *(void **)&dspk__hipfft.exec_z2d = f[11];
    s->rc = 0;
  }
out:
  dspk__gpurt_load_why(s, why, whylen);
  return s->rc;
}

void dspk__hip_unload(void) {
  /* The libraries stay mapped, as CUDA's do (backends/cuda/loader.c): the
   * HIP runtime keeps threads and exit handlers of its own. */
  memset(&dspk__hipfft, 0, sizeof(dspk__hipfft));
  memset(&dspk__hipblas, 0, sizeof(dspk__hipblas));
  memset(&dspk__hiprtc, 0, sizeof(dspk__hiprtc));
  memset(&dspk__hip, 0, sizeof(dspk__hip));
  memset(&st, 0, sizeof(st));
}
