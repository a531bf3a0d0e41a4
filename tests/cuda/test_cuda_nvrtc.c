/*
 * CI test of the CUDA kernel sources, no GPU needed: every generated kernel
 * source (each family, each dtype) compiles with NVRTC for sm_80 and sm_90
 * (the GPU runtime's gemm and dft fallbacks for sm_90);
 * a broken source fails with DSPK_ECOMPILE and the compiler's log; and the
 * sources stay in the subset hiprtc also compiles (no headers, no inline
 * PTX, no CUDA-only intrinsics).  Exits 77 (skipped) only when NVRTC is
 * genuinely absent.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "backends/cuda/cuda_internal.h"

static void test_every_source_compiles(void **state) {
  static const char *const archs[] = {"sm_80", "sm_90"};
  static const dspk_dtype dts[] = {DSPK_F32, DSPK_F64, DSPK_C64, DSPK_C128};
  int compiled = 0;
  (void)state;
  for (int f = 0; f < DSPK__K_COUNT; f++) {
    int ndt = dspk__kfamily_typed(f) ? 4 : 1;
    for (int t = 0; t < ndt; t++) {
      char *src = NULL;
      size_t len = 0;
      assert_int_equal(dspk__kernel_source(f, dts[t], &src, &len), 0);
      assert_int_equal(strlen(src), len);
      for (int a = 0; a < 2; a++) {
        char log[4096], name[64];
        /* The GPU runtime's fallbacks (gemm, dft): sm_90 only, the arch
         * the GPU suite runs them on; hip.hiprtc compiles them for AMD. */
        if (a == 0 && (f == DSPK__K_GEMM || f == DSPK__K_DFT))
          continue;
        void *bin = NULL;
        size_t blen = 0;
        int rc;
        snprintf(name, sizeof(name), "%s_%s.cu", dspk__kfamily_name(f),
                 dspk__dtype_name(dts[t]));
        rc = dspk__cuda_compile(NULL, archs[a], name, src, len, &bin, &blen, log,
                                sizeof(log));
        if (rc != 0)
          fail_msg("%s for %s: %d: %s", name, archs[a], rc, log);
        assert_true(blen > 1000);
        /* A cubin is an ELF file. */
        assert_memory_equal(bin, "\x7f" "ELF", 4);
        free(bin);
        compiled++;
      }
      free(src);
    }
  }
  assert_int_equal(compiled, 2 * (3 * 4 + 1) + 2 * 4);
}

static void test_typed_family_rejects_other_dtypes(void **state) {
  char *src = NULL;
  size_t len;
  (void)state;
  assert_int_equal(dspk__kernel_source(DSPK__K_MAP, DSPK_BF16, &src, &len), DSPK_EDTYPE);
  assert_null(src);
}

static void test_compile_error_returns_log(void **state) {
  const char *bad = "extern \"C\" __global__ void k(float *x) { x[0] = undeclared_y; }";
  char log[4096];
  void *bin = NULL;
  size_t blen = 0;
  (void)state;
  assert_int_equal(dspk__cuda_compile(NULL, "sm_90", "bad.cu", bad, strlen(bad), &bin,
                                      &blen, log, sizeof(log)),
                   DSPK_ECOMPILE);
  assert_null(bin);
  assert_non_null(strstr(log, "undeclared_y"));
  assert_non_null(strstr(log, "error"));
}

/* A client's source cannot make NVRTC read a file: an include of a file
 * that exists (with identifiers NVRTC would quote) and of one that does not
 * fail alike, with ECOMPILE, and the log holds none of the file.  Every way
 * to name a file is tried: quotes, angle brackets, a relative path, spaces,
 * comments and a splice inside the directive, a digraph and a trigraph for
 * '#', __has_include, _Pragma, and a pragma naming a file. */
static void test_includes_refused(void **state) {
  static const char *const forms[] = {
      "#include \"%s\"\n",
      "#include <%s>\n",
      "  # /* c */ include \"%s\"\n",
      "#inc\\\nlude \"%s\"\n",
      "%%:include \"%s\"\n",
      "?\?=include \"%s\"\n",
      "#include_next \"%s\"\n",
      "#if __has_include(\"%s\")\n#endif\n",
      "_Pragma(\"GCC dependency \\\"%s\\\"\")\n",
      "#pragma GCC dependency \"%s\"\n",
      "/* */ #include \"%s\"\n",
  };
  char dir[] = "/tmp/dspk-nvrtc-XXXXXX", there[64], missing[64], src[256], log1[4096],
       log2[4096];
  FILE *f;
  (void)state;
  assert_non_null(mkdtemp(dir));
  snprintf(there, sizeof there, "%s/secret.h", dir);
  snprintf(missing, sizeof missing, "%s/missing.h", dir);
  f = fopen(there, "w");
  assert_non_null(f);
  fputs("secret_token_xyzzy plugh_identifier;\n", f);
  fclose(f);
  for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
    const char *paths[2] = {there, missing};
    char *logs[2] = {log1, log2};
    for (int p = 0; p < 2; p++) {
      void *bin = NULL;
      size_t blen = 0;
      int n = snprintf(src, sizeof src, forms[i], paths[p]);
      /* Only the file name differs between the two: compare the logs with
       * the name blanked. */
      n += snprintf(src + n, sizeof src - (size_t)n,
                    "extern \"C\" __global__ void k(float *x) { x[0] = 1; }\n");
      assert_int_equal(dspk__cuda_compile(NULL, "sm_80", "kernel.cu", src, strlen(src), &bin,
                                          &blen, logs[p], sizeof log1),
                       DSPK_ECOMPILE);
      assert_null(bin);
      assert_null(strstr(logs[p], "xyzzy"));
      assert_null(strstr(logs[p], "plugh"));
      assert_non_null(strstr(logs[p], "raw kernels cannot read files"));
    }
    assert_string_equal(log1, log2);
  }
  /* A relative path from the working directory, as the report found. */
  {
    void *bin = NULL;
    size_t blen = 0;
    const char *rel = "#include \"../../../../../../../../etc/passwd\"\n";
    assert_int_equal(dspk__cuda_compile(NULL, "sm_80", "kernel.cu", rel, strlen(rel), &bin,
                                        &blen, log1, sizeof log1),
                     DSPK_ECOMPILE);
    assert_null(strstr(log1, "root"));
  }
  /* Pragmas that name no file, and "#include" in a string or comment, still
   * compile. */
  {
    void *bin = NULL;
    size_t blen = 0;
    const char *ok = "// #include \"x.h\"\n"
                     "extern \"C\" __global__ void k(float *x) {\n"
                     "  const char *s = \"#include <y.h>\"; (void)s;\n"
                     "#pragma unroll\n"
                     "  for (int i = 0; i < 4; i++) x[i] = 1;\n}\n";
    assert_int_equal(dspk__cuda_compile(NULL, "sm_80", "kernel.cu", ok, strlen(ok), &bin,
                                        &blen, log1, sizeof log1),
                     0);
    free(bin);
  }
  unlink(there);
  rmdir(dir);
}

static void test_sources_in_hiprtc_subset(void **state) {
  static const char *const banned[] = {"#include", "asm(", "asm volatile", "__ldg",
                                       "_sync(", "cooperative_groups", "__nv",
                                       "cuda_fp16", "texture<", NULL};
  int files = 0;
  (void)state;
  for (const struct dspk__kernel_file *k = dspk__kernel_files; k->name; k++) {
    for (int b = 0; banned[b]; b++)
      if (strstr(k->text, banned[b]))
        fail_msg("%s uses \"%s\", which hiprtc does not compile", k->name, banned[b]);
    files++;
  }
  assert_true(files >= 5);
}

int main(void) {
  char why[200];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_source_compiles),
      cmocka_unit_test(test_typed_family_rejects_other_dtypes),
      cmocka_unit_test(test_compile_error_returns_log),
      cmocka_unit_test(test_sources_in_hiprtc_subset),
      cmocka_unit_test(test_includes_refused),
  };
  if (dspk__cuda_load_nvrtc(why, sizeof(why)) != 0) {
    printf("skipped: %s\n", why);
    return 77;
  }
  printf("NVRTC %d.%d\n", dspk__nvrtc.major, dspk__nvrtc.minor);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
