/*
 * A client's SPIR-V validated before the driver sees it.  Vulkan requires
 * the module of vkCreateShaderModule to be valid SPIR-V for the API version
 * (VkShaderModuleCreateInfo: "pCode must point to valid SPIR-V code") and
 * leaves anything else undefined: a driver may refuse it, run it, or fault
 * (lavapipe dies in vkCreateComputePipelines on a module that decorates an
 * id nothing defines).  So every raw kernel's module (lang spirv, and the
 * SPIR-V glslang made of a client's GLSL) goes through SPIRV-Tools'
 * validator (spirv-val's library) for the Vulkan version the device was
 * created with, and one it refuses never reaches the driver.  In the same
 * child the validated module's indices are clamped (vk_spvrobust.c) and the
 * result validated again; the child answers with that module.  The daemon's
 * generated kernels are ours and are not validated here.
 *
 * The validator is paid once per module: kernels are memoized per device
 * (vk_shader.c), and a module in the table is not validated again.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* libspirv.h defines a const at file scope, which in C is an external
 * definition: renamed here so that no other C file including it collides. */
#define kDefaultMaxIdBound dspk__vk_spvval_kDefaultMaxIdBound
#include <spirv-tools/libspirv.h>
#undef kDefaultMaxIdBound

#include <stdlib.h>

#include "backends/common/kcompile.h"
#include "backends/vulkan/vk.h"
#include "dspk/errors.h"
#include "proto/codec.h"
#include "proto/utf8.h"

/* The validator's message as echoed: it may quote the module's own strings
 * (OpName, OpString, an entry point's name), which are the client's. */
#define ECHO_MAX 400

/* The validator's environment for a device of Vulkan apiVersion api, within
 * the instance's 1.3 (vk_backend.c); the backend needs 1.2. */
static spv_target_env env_of(uint32_t api, const char **name) {
  if (VK_API_VERSION_MINOR(api) >= 3 || VK_API_VERSION_MAJOR(api) > 1) {
    *name = "vulkan1.3";
    return SPV_ENV_VULKAN_1_3;
  }
  *name = "vulkan1.2";
  return SPV_ENV_VULKAN_1_2;
}

int dspk__vk_spv_validate(uint32_t api, const uint32_t *w, size_t nw, char *msg,
                          size_t msglen) {
  const char *envname;
  spv_target_env env = env_of(api, &envname);
  spv_context ctx = spvContextCreate(env);
  if (!ctx)
    return DSPK_ENOMEM;
  spv_validator_options opt = spvValidatorOptionsCreate();
  if (!opt) {
    spvContextDestroy(ctx);
    return DSPK_ENOMEM;
  }
  /* The device enables none of the block-layout features beyond the
   * version's own (vk_backend.c), so the defaults are the device's rules. */
  spv_const_binary_t bin = {.code = w, .wordCount = nw};
  spv_diagnostic diag = NULL;
  spv_result_t vr = spvValidateWithOptions(ctx, opt, &bin, &diag);
  int r = 0;
  if (vr == SPV_ERROR_OUT_OF_MEMORY) {
    r = DSPK_ENOMEM;
  } else if (vr != SPV_SUCCESS) {
    /* The validator's text, not a client's string: its first ECHO_MAX
     * bytes (cut at a character, then "..."), made one line as a compiler's
     * log is (dspk__one_line: lines joined with "; "). */
    const char *text = diag && diag->error ? diag->error : "";
    size_t n = strlen(text), k = dspk__utf8_cut(text, n, ECHO_MAX);
    char head[ECHO_MAX + 1], line[3 * ECHO_MAX + 1];
    memcpy(head, text, k);
    head[k] = '\0';
    line[dspk__one_line(line, head)] = '\0';
    r = dspk__fail(msg, msglen, DSPK_ECOMPILE, "spirv: invalid SPIR-V module (spirv-val, %s): "
                   "%s%s", envname, line[0] ? line : "refused", k < n ? "..." : "");
  }
  spvDiagnosticDestroy(diag);
  spvValidatorOptionsDestroy(opt);
  spvContextDestroy(ctx);
  return r;
}

/* ---- in a child -------------------------------------------------------------
 * The validator's time and memory grow with the module, which a client
 * makes (a module of max_message bytes, a large id bound, a deep control
 * flow graph): on the runner thread that would hold every user's work on
 * the device, so a daemon validates a client's module in a child,
 * `EXE --kernel-compile spvval:API`, under the limits of kcompile.h. */

/* The module validated, clamped (vk_spvrobust.c) and validated again: 0
 * with *out (malloc'd, *nout words), or the error with msg. */
static int validate_clamp(uint32_t api, const uint32_t *w, size_t nw, uint32_t **out,
                          size_t *nout, char *msg, size_t msglen) {
  const char *envname;
  uint32_t *o = NULL;
  size_t no = 0;
  int r = dspk__vk_spv_validate(api, w, nw, msg, msglen);
  if (!r)
    r = dspk__vk_spv_robust(env_of(api, &envname) == SPV_ENV_VULKAN_1_3, w, nw, &o, &no, msg,
                            msglen);
  if (r)
    return r;
  /* The pass's output is SPIRV-Tools', not the client's: refused here, it
   * is the daemon's failure to bound the module, said as such. */
  char why[1024] = "";
  r = dspk__vk_spv_validate(api, o, no, why, sizeof why);
  if (r) {
    free(o);
    if (r == DSPK_ENOMEM)
      return r;
    return dspk__fail(msg, msglen, DSPK_EINVAL, "kernel: the daemon cannot bound this "
                      "module's memory accesses: the module with its indices clamped is "
                      "not valid (%s)", why);
  }
  *out = o;
  *nout = no;
  return 0;
}

static int validate_fn(void *ud, const char *in, size_t len, void **bin, size_t *binlen,
                       char *log, size_t loglen) {
  uint32_t api = *(const uint32_t *)ud;
  uint32_t *o = NULL;
  size_t no = 0;
  *bin = NULL;
  *binlen = 0;
  if (len % 4)
    return DSPK_EINVAL;
  /* in is malloc'd (kcompile.c): its words are aligned. */
  int r = validate_clamp(api, (const uint32_t *)(const void *)in, len / 4, &o, &no, log,
                         loglen);
  if (r)
    return r;
  *bin = o;
  *binlen = no * 4;
  return 0;
}

int dspk__vk_spvval_main(const char *api) {
  char *end;
  unsigned long v = strtoul(api, &end, 10);
  static uint32_t a;
  if (end == api || *end || v > UINT32_MAX)
    return 2;
  a = (uint32_t)v;
  return dspk__kcompile_serve(validate_fn, &a, NULL);
}

int dspk__vk_spv_validate_client(struct dspk__dev *d, const uint32_t *w, size_t nw,
                                 atomic_int *cancel, uint32_t **out, size_t *nout, char *msg,
                                 size_t msglen) {
  char lang[64];
  void *bin = NULL;
  size_t binlen = 0;
  /* The header's reserved parts, which the validator does not check in
   * full (it takes any Schema word) and a driver refuses with no word on
   * why (lavapipe: VK_ERROR_UNKNOWN from vkCreateComputePipelines): the
   * version's bytes 0 and 3, and the Schema word, must be 0 (SPIR-V 2.3,
   * "Physical Layout"). */
  if (nw >= 5 && (w[1] & 0xff0000ffu))
    return dspk__fail(msg, msglen, DSPK_ECOMPILE, "spirv: invalid SPIR-V module header: its "
                      "version word (word 1) is 0x%08x, whose bytes 0 and 3 are reserved and "
                      "must be 0 (0x00MMmm00 for version MM.mm)", (unsigned)w[1]);
  if (nw >= 5 && w[4] != 0)
    return dspk__fail(msg, msglen, DSPK_ECOMPILE, "spirv: invalid SPIR-V module header: its "
                      "Schema word (word 4) is %u; it is reserved and must be 0",
                      (unsigned)w[4]);
  /* The id bound sizes the validator's tables (and vk_spvcheck.c's): a
   * module needs no more ids than it has words to use them in, and a
   * larger bound is refused before anything looks at it. */
  uint64_t most = 65536 + 4 * (uint64_t)nw;
  if (nw >= 5 && w[3] > most)
    return dspk__fail(msg, msglen, DSPK_ELIMIT, "spirv: the module's id bound %u is above "
                      "%llu (65536 + 4 per word of its %zu words)", (unsigned)w[3],
                      (unsigned long long)most, nw);
  if (!d->env.compile_exe)
    return validate_clamp(d->props.apiVersion, w, nw, out, nout, msg, msglen);
  snprintf(lang, sizeof lang, "spvval:%u", (unsigned)d->props.apiVersion);
  int r = dspk__kcompile_run(NULL, d->env.compile_exe, lang, (const char *)w, nw * 4, cancel,
                             &bin, &binlen, msg, msglen);
  if (r)
    return r;
  if (binlen % 4 || binlen < 20) {
    free(bin);
    return dspk__fail(msg, msglen, DSPK_ECOMPILE, "spirv: the validator's child gave no "
                      "module");
  }
  *out = bin;
  *nout = binlen / 4;
  return 0;
}
