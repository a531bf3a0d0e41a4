/*
 * Unit tests of the raw-kernel source check (backends/common/srccheck.c):
 * every spelling of a file-opening directive is refused in both languages
 * (and the message names the directive and line, never the file), while
 * the same words in comments, string literals, raw strings and harmless
 * pragmas pass.  NVRTC and glslang themselves are driven with these forms
 * in tests/cuda (test_cuda_nvrtc) and tests/daemon (group "kernelfs").
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "backends/common/srccheck.h"
#include "dspk/errors.h"

static int check(const char *src, enum dspk__src_lang lang, char *msg, size_t cap) {
  return dspk__src_check(src, strlen(src), lang, "k", msg, cap);
}

static void test_refused(void **st) {
  static const struct {
    const char *src, *what;
  } cases[] = {
      {"#include \"/etc/passwd\"\n", "k:1: #include is refused"},
      {"x\n\n#include <stdio.h>\n", "k:3: #include is refused"},
      {"   #   include \"a\"\n", "k:1: #include is refused"},
      {"#/**/include \"a\"\n", "k:1: #include is refused"},
      {"#\\\ninclude \"a\"\n", "k:1: #include is refused"},
      {"#inc\\\r\nlude \"a\"\n", "k:1: #include is refused"},
      {"%:include \"a\"\n", "k:1: #include is refused"},
      {"/*\n*/ #include \"a\"\n", "k:2: #include is refused"},
      {"#include_next <a>\n", "#include_next is refused"},
      {"#import \"a\"\n", "#import is refused"},
      {"#embed \"a\"\n", "#embed is refused"},
      {"#if defined(X) && __has_include(<a>)\n#endif\n", "k:1: __has_include is refused"},
      {"_Pragma(\"once\")\n", "_Pragma is refused"},
      {"#\\u0069nclude \"a\"\n", "'#' followed by a backslash"},
      {"int \\u0061;\n", "universal character name"},
      {"#extension GL_GOOGLE_include_directive : require\n#include \"a\"\n",
       "k:2: #include is refused"},
  };
  char msg[256];
  (void)st;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    for (int lang = 0; lang < 2; lang++) {
      msg[0] = 0;
      assert_int_equal(check(cases[i].src, (enum dspk__src_lang)lang, msg, sizeof msg),
                       DSPK_ECOMPILE);
      if (!strstr(msg, cases[i].what))
        fail_msg("case %zu: \"%s\" lacks \"%s\"", i, msg, cases[i].what);
      assert_null(strstr(msg, "passwd"));
      assert_non_null(strstr(msg, "raw kernels cannot read files"));
    }
}

static void test_cuda_only(void **st) {
  char msg[256];
  (void)st;
  /* Trigraphs: ??= is '#', ??/ a backslash (both readings are scanned). */
  assert_int_equal(check("?\?=include \"a\"\n", DSPK__SRC_CUDA, msg, sizeof msg),
                   DSPK_ECOMPILE);
  assert_int_equal(check("// ?\?/\n#include \"a\"\n", DSPK__SRC_CUDA, msg, sizeof msg),
                   DSPK_ECOMPILE);
  /* Pragmas: the listed ones pass, any other is refused. */
  assert_int_equal(check("#pragma unroll 4\n#pragma nv_diag_suppress 177\n", DSPK__SRC_CUDA,
                         msg, sizeof msg),
                   0);
  assert_int_equal(check("#pragma GCC dependency \"a\"\n", DSPK__SRC_CUDA, msg, sizeof msg),
                   DSPK_ECOMPILE);
  assert_non_null(strstr(msg, "#pragma GCC is refused"));
  assert_int_equal(check("#pragma include_alias(\"a\", \"b\")\n", DSPK__SRC_CUDA, msg,
                         sizeof msg),
                   DSPK_ECOMPILE);
  /* GLSL before 4.20 does not splice a comment's line: the next line's
   * directive is live there, so it is refused in GLSL. */
  assert_int_equal(check("#version 410\n// c \\\n#include \"a\"\n", DSPK__SRC_GLSL, msg,
                         sizeof msg),
                   DSPK_ECOMPILE);
  /* GLSL has no literals: a quote hides nothing. */
  assert_int_equal(check("' __has_include\n", DSPK__SRC_GLSL, msg, sizeof msg),
                   DSPK_ECOMPILE);
  /* GLSL pragmas open nothing. */
  assert_int_equal(check("#pragma optimize(off)\n", DSPK__SRC_GLSL, msg, sizeof msg), 0);
}

static void test_passes(void **st) {
  static const char *const ok[] = {
      "// #include \"a\"\nint x;\n",
      "/* #include \"a\"\n#include \"b\" */ int x;\n",
      "const char *s = \"#include <a>\";\n",
      "const char *s = \"\\\"#include <a>\";\n",
      "char c = '#'; int include;\n",
      "const char *r = R\"x(\n#include \"a\"\n)x\";\n",
      "#define INC 1\n#if INC\n#endif\n#line 10 \"name\"\n#error stop\n",
      "int has_include_x, __has_includes;\n",
      "#version 450\nlayout(local_size_x = 1) in;\nvoid main() {}\n",
      "",
  };
  char msg[256];
  (void)st;
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    msg[0] = 0;
    if (check(ok[i], DSPK__SRC_CUDA, msg, sizeof msg) != 0)
      fail_msg("case %zu refused: %s", i, msg);
  }
  assert_int_equal(check(ok[0], DSPK__SRC_GLSL, msg, sizeof msg), 0);
  assert_int_equal(check(ok[8], DSPK__SRC_GLSL, msg, sizeof msg), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_refused),
      cmocka_unit_test(test_cuda_only),
      cmocka_unit_test(test_passes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
