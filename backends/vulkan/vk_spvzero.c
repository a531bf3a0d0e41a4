/*
 * Zero initialisation of a client's shader (raw kernels, docs/protocol.md
 * "kernel"): memory a shader reads before writing must never hold what
 * another task left there.  Workgroup (`shared`) memory keeps its bytes
 * from one dispatch to the next on real devices and on lavapipe alike (a
 * raw kernel that copied out an unwritten `shared` array got another user's
 * gemm operands), and registers or private scratch behind an uninitialised
 * local variable or an OpUndef can hold another invocation's values.
 *
 * The rewrite gives every variable of the Workgroup, Private and Function
 * storage classes without an initializer the initializer OpConstantNull of
 * its type, and turns every OpUndef into an OpConstantNull of the same id
 * and type, hoisted out of the functions.  A Workgroup initializer needs
 * the device feature shaderZeroInitializeWorkgroupMemory
 * (VK_KHR_zero_initialize_workgroup_memory, core in Vulkan 1.3); a device
 * without it cannot run a kernel that declares Workgroup memory.  The
 * driver zeroes such memory at the start of each workgroup (on lavapipe a
 * loop over the array, shared among the invocations); a Function or Private
 * variable that the shader writes before reading costs nothing after the
 * driver's dead-store elimination.
 *
 * Each OpConstantNull goes right after the declaration of its type, so it
 * is defined before any use, also by a global variable's initializer.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <spirv/unified1/spirv.h>

#include "backends/vulkan/vk.h"
#include "dspk/errors.h"


#define ID_BOUND_MAX 4194303u /* SPIR-V's universal limit on ids */

static uint32_t op_of(uint32_t w) { return w & 0xffffu; }
static uint32_t len_of(uint32_t w) { return w >> 16; }

struct zid {
  uint32_t def;    /* word index of the type declaring it; 0: not a type */
  uint32_t null;   /* id of its OpConstantNull made for variables; 0: none */
  uint32_t undef;  /* 1 + index in the list of OpUndefs of its first one; 0: none */
  uint8_t done;    /* that constant was written */
  uint8_t nullok;  /* 0 unknown, 1 OpConstantNull is valid for the type, 2 not */
};

/* Whether OpConstantNull may be of type id: scalars, vectors, matrices,
 * arrays, structs of those, pointers (not images, samplers, cooperative
 * matrices, runtime arrays). */
static int null_ok(const uint32_t *w, struct zid *ids, uint32_t bound, uint32_t id,
                   int depth) {
  if (id >= bound || !ids[id].def || depth > 32)
    return 0;
  if (ids[id].nullok)
    return ids[id].nullok == 1;
  const uint32_t *t = w + ids[id].def;
  uint32_t l = len_of(t[0]);
  int ok = 0;
  switch (op_of(t[0])) {
  case SpvOpTypeBool: case SpvOpTypeInt: case SpvOpTypeFloat: case SpvOpTypePointer: ok = 1; break;
  case SpvOpTypeVector: case SpvOpTypeMatrix: case SpvOpTypeArray:
    ok = l >= 3 && null_ok(w, ids, bound, t[2], depth + 1);
    break;
  case SpvOpTypeStruct:
    ok = 1;
    for (uint32_t k = 2; k < l && ok; k++)
      ok = null_ok(w, ids, bound, t[k], depth + 1);
    break;
  default: break;
  }
  ids[id].nullok = ok ? 1 : 2;
  return ok;
}

int dspk__vk_spv_zero_init(const uint32_t *w, size_t nw, int workgroup, uint32_t **out,
                           size_t *nout, char *msg, size_t msglen) {
  struct zid *ids = NULL;
  uint32_t *o = NULL;
  /* The OpUndefs: word index and the next of the same type (1 + index). */
  struct undef { size_t at; uint32_t next; } *u = NULL;
  uint32_t nu = 0;
  size_t no = 0, extra = 0;
  int r = 0;
  if (nw < 5 || w[0] != 0x07230203 || w[3] == 0 || w[3] > ID_BOUND_MAX) {
    snprintf(msg, msglen, "spirv: not a SPIR-V module (its header)");
    return DSPK_EINVAL;
  }
  uint32_t bound = w[3];
  if (!(ids = calloc(bound, sizeof *ids)))
    return DSPK_ENOMEM;

  /* The types, and the lengths: every instruction must end in the module. */
  for (size_t i = 5; i < nw;) {
    uint32_t op = op_of(w[i]), l = len_of(w[i]);
    if (l == 0 || i + l > nw) {
      snprintf(msg, msglen, "spirv: malformed module (an instruction at word %zu runs past "
               "its end)", i);
      r = DSPK_EINVAL;
      goto out;
    }
    if (op >= SpvOpTypeBool && op <= SpvOpTypePointer && l >= 2 && w[i + 1] < bound &&
        !ids[w[i + 1]].def)
      ids[w[i + 1]].def = (uint32_t)i;
    i += l;
  }
  /* Which types need a null constant for variables; the OpUndefs.  New
   * ids are counted from the bound. */
  uint32_t next = bound;
  for (size_t i = 5; i < nw; i += len_of(w[i])) {
    const uint32_t *in = w + i;
    uint32_t op = op_of(in[0]), l = len_of(in[0]);
    if (op == SpvOpUndef && l == 3 && null_ok(w, ids, bound, in[1], 0)) {
      nu++; /* moved, as many words */
    } else if (op == SpvOpVariable && l == 4 &&
               (in[3] == SpvStorageClassWorkgroup || in[3] == SpvStorageClassPrivate || in[3] == SpvStorageClassFunction)) {
      const uint32_t *p = in[1] < bound && ids[in[1]].def ? w + ids[in[1]].def : NULL;
      uint32_t t = p && op_of(p[0]) == SpvOpTypePointer && len_of(p[0]) >= 4 ? p[3] : 0;
      if (in[3] == SpvStorageClassWorkgroup && !workgroup) {
        snprintf(msg, msglen, "kernel: the shader declares workgroup (shared) memory, which "
                 "this device cannot zero-initialise (it lacks "
                 "shaderZeroInitializeWorkgroupMemory): raw kernels using it cannot run here");
        r = DSPK_ENOTSUP;
        goto out;
      }
      if (!null_ok(w, ids, bound, t, 0)) {
        if (in[3] == SpvStorageClassWorkgroup) {
          snprintf(msg, msglen, "kernel: the shader's workgroup variable %u has a type "
                   "that cannot be zero-initialised", in[2]);
          r = DSPK_ENOTSUP;
          goto out;
        }
        continue; /* an opaque handle: no bytes of anyone's */
      }
      if (!ids[t].null) {
        if (next >= ID_BOUND_MAX) {
          snprintf(msg, msglen, "spirv: the module has too many ids to zero-initialise");
          r = DSPK_ELIMIT;
          goto out;
        }
        ids[t].null = next++;
        extra += 3;
      }
      extra += 1;
    }
  }

  if (!(o = malloc((nw + extra) * sizeof *o)) || (nu && !(u = calloc(nu, sizeof *u)))) {
    r = DSPK_ENOMEM;
    goto out;
  }
  nu = 0;
  for (size_t i = 5; i < nw; i += len_of(w[i]))
    if (op_of(w[i]) == SpvOpUndef && len_of(w[i]) == 3 && null_ok(w, ids, bound, w[i + 1], 0)) {
      u[nu].at = i;
      u[nu].next = ids[w[i + 1]].undef;
      ids[w[i + 1]].undef = ++nu;
    }
  memcpy(o, w, 5 * sizeof *o);
  o[3] = next;
  no = 5;
  for (size_t i = 5; i < nw; i += len_of(w[i])) {
    const uint32_t *in = w + i;
    uint32_t op = op_of(in[0]), l = len_of(in[0]);
    if (op == SpvOpUndef && l == 3 && null_ok(w, ids, bound, in[1], 0))
      continue; /* written after its type, below */
    if (op == SpvOpVariable && l == 4 &&
        (in[3] == SpvStorageClassWorkgroup || in[3] == SpvStorageClassPrivate || in[3] == SpvStorageClassFunction)) {
      const uint32_t *p = in[1] < bound && ids[in[1]].def ? w + ids[in[1]].def : NULL;
      uint32_t t = p && op_of(p[0]) == SpvOpTypePointer && len_of(p[0]) >= 4 ? p[3] : 0;
      if (t && t < bound && ids[t].null) {
        if (!ids[t].done) /* its type came after the pointer's use: malformed */
          break;
        o[no++] = (5u << 16) | SpvOpVariable;
        o[no++] = in[1];
        o[no++] = in[2];
        o[no++] = in[3];
        o[no++] = ids[t].null;
        continue;
      }
    }
    memcpy(o + no, in, l * sizeof *o);
    no += l;
    /* After a type's declaration: its null constants. */
    if (op >= SpvOpTypeBool && op <= SpvOpTypePointer && l >= 2 && in[1] < bound &&
        ids[in[1]].def == i) {
      uint32_t t = in[1];
      if (ids[t].null) {
        o[no++] = (3u << 16) | SpvOpConstantNull;
        o[no++] = t;
        o[no++] = ids[t].null;
        ids[t].done = 1;
      }
      /* The OpUndefs of this type, wherever they are. */
      for (uint32_t k = ids[t].undef; k; k = u[k - 1].next) {
        o[no++] = (3u << 16) | SpvOpConstantNull;
        o[no++] = t;
        o[no++] = w[u[k - 1].at + 2];
      }
    }
  }
  if (no != nw + extra) {
    snprintf(msg, msglen, "spirv: malformed module (a variable's type is declared after "
             "it)");
    r = DSPK_EINVAL;
    goto out;
  }
  *out = o;
  *nout = no;
  o = NULL;
out:
  free(u);
  free(o);
  free(ids);
  return r;
}
