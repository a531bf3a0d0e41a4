/*
 * Index clamping of a client's shader (raw kernels, docs/protocol.md
 * "kernel"): a raw kernel reaches memory only through its bindings.
 * Vulkan's robustness features (robustBufferAccess2, vk_shader.c) bound
 * the accesses to storage and uniform buffers alone; an index past a
 * workgroup (`shared`) array, a private or local array, a push-constant
 * array, or a vector or matrix indexed by a variable is undefined, and on
 * lavapipe, which runs shaders inside the daemon's process, such a store
 * wrote into the daemon's heap and a far one ended the daemon (probe 22).
 *
 * SPIRV-Tools' GraphicsRobustAccessPass (spirv-opt --graphics-robust-access,
 * run through vk_spvrobust_opt.cpp) clamps every index of every
 * OpAccessChain and OpInBoundsAccessChain of the functions the entry points
 * reach, in any storage class: an index into an array, vector or matrix of
 * N elements becomes SClamp(index, 0, N - 1) (a constant index past the end
 * becomes N - 1, a negative one 0; an array whose length is a
 * specialization constant is clamped to its value; a runtime array to its
 * OpArrayLength), so every access chain points inside its variable.  It
 * refuses modules it cannot bound (variable pointers, a non-Logical
 * addressing model, runtime descriptor arrays), which dspk refuses too.
 *
 * Accesses to storage buffers keep Vulkan's robustness instead, as
 * protocol.md documents (a load past a tensor reads zero, a store there is
 * dropped, where the device has robustBufferAccess2; the pass would send
 * them to the last element): the index operands of each access chain whose
 * result points into the StorageBuffer or Uniform storage class are put
 * back as the client's module had them (the pass keeps each access chain's
 * result id and its number of operands, and only adds instructions; the
 * clamps so left unused are dropped by the driver's compiler).
 *
 * The whole step runs with the validator, in the validator's child
 * (vk_spvval.c), and the result is validated again: a module the pass would
 * make invalid never reaches the driver.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <spirv/unified1/spirv.h>

#include "backends/vulkan/vk.h"
#include "dspk/errors.h"
#include "proto/utf8.h"


#define ID_BOUND_MAX 4194303u /* SPIR-V's universal limit on ids */

/* vk_spvrobust_opt.cpp. */
int dspk__vk_spv_robust_pass(int vulkan13, const uint32_t *w, size_t nw, uint32_t **out,
                             size_t *nout, char *msg, size_t msglen);

/* Whether module w (nw words) has a header and whole instructions. */
static int readable(const uint32_t *w, size_t nw) {
  if (nw < 5 || w[3] > ID_BOUND_MAX + 1)
    return 0;
  for (size_t i = 5; i < nw;) {
    uint32_t n = w[i] >> 16;
    if (n == 0 || n > nw - i)
      return 0;
    i += n;
  }
  return 1;
}

/* In module o (no words), the index operands of each access chain into a
 * buffer are put back as module w (nw words) had them: 0, or DSPK_EINVAL
 * when the two do not correspond (a chain of o that w lacks, or of another
 * length), DSPK_ENOMEM. */
static int restore_buffers(const uint32_t *w, size_t nw, uint32_t *o, size_t no) {
  if (!readable(w, nw) || !readable(o, no))
    return DSPK_EINVAL;
  size_t bound = o[3] > w[3] ? o[3] : w[3];
  uint32_t *chain = calloc(bound, sizeof *chain); /* id -> word index in w */
  uint8_t *sc = calloc(bound, 1);                  /* pointer type id -> 1 + class */
  int r = 0;
  if (!chain || !sc) {
    r = DSPK_ENOMEM;
    goto out;
  }
  for (size_t i = 5; i < nw; i += w[i] >> 16) {
    uint32_t op = w[i] & 0xffffu, n = w[i] >> 16;
    if ((op == SpvOpAccessChain || op == SpvOpInBoundsAccessChain) && n >= 4 && w[i + 2] < bound)
      chain[w[i + 2]] = (uint32_t)i;
  }
  for (size_t i = 5; i < no; i += o[i] >> 16) {
    uint32_t op = o[i] & 0xffffu, n = o[i] >> 16;
    if (op == SpvOpTypePointer && n == 4 && o[i + 1] < bound && o[i + 2] < 255)
      sc[o[i + 1]] = (uint8_t)(1 + o[i + 2]);
    if ((op != SpvOpAccessChain && op != SpvOpInBoundsAccessChain) || n < 4)
      continue;
    uint32_t type = o[i + 1], id = o[i + 2];
    if (type >= bound || id >= bound || !sc[type])
      continue; /* a pointer type declared later: none in a valid module */
    if (sc[type] != 1 + SpvStorageClassStorageBuffer && sc[type] != 1 + SpvStorageClassUniform)
      continue;
    uint32_t at = chain[id];
    if (!at || w[at] != o[i] || w[at + 1] != type) {
      r = DSPK_EINVAL;
      goto out;
    }
    memcpy(&o[i + 3], &w[at + 3], (n - 3) * sizeof *o);
  }
out:
  free(chain);
  free(sc);
  return r;
}

int dspk__vk_spv_robust(int vulkan13, const uint32_t *w, size_t nw, uint32_t **out,
                        size_t *nout, char *msg, size_t msglen) {
  char why[512] = "";
  uint32_t *o = NULL;
  size_t no = 0;
  int r = dspk__vk_spv_robust_pass(vulkan13, w, nw, &o, &no, why, sizeof why);
  if (r == DSPK_ENOMEM)
    return r;
  if (r == 0 && (r = restore_buffers(w, nw, o, no)) == DSPK_ENOMEM) {
    free(o);
    return r;
  }
  if (r) {
    free(o);
    /* The pass's own text (SPIRV-Tools', which may quote the module's
     * names, the client's bytes): escaped and cut as any echo. */
    char echo[DSPK__ECHO_CAP(300)];
    dspk__utf8_echo(echo, sizeof echo, why, strlen(why), 300);
    return dspk__fail(msg, msglen, DSPK_EINVAL,
                      "kernel: the daemon cannot bound this module's memory accesses "
                      "(SPIRV-Tools' graphics-robust-access pass refused it: %s); "
                      "a raw kernel's module must use Logical addressing, without "
                      "variable pointers",
                      why[0] ? echo : "its access chains do not match the module's");
  }
  *out = o;
  *nout = no;
  return 0;
}
