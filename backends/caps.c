/*
 * Device capabilities (struct dspk__devcaps, backends/backend.h): the ops
 * and dtypes a device runs and the kernel languages it compiles, and the
 * one check the daemon routes with.
 */
#include <string.h>

#include "backends/backend.h"
#include "proto/schema.h"
#include "proto/utf8.h"

#define BIT(dt) (1u << (unsigned)(dt))

void dspk__caps_add_ops(struct dspk__devcaps *c, uint32_t mask) {
  for (int op = 0; op < DSPK_OP_COUNT; op++)
    if (mask & (1u << op))
      c->dtypes[op] = dspk__op_dtypes[op];
}

void dspk__caps_drop_dtype(struct dspk__devcaps *c, dspk_dtype dt) {
  for (int op = 0; op < DSPK_OP_COUNT; op++)
    if (op != DSPK_OP_KERNEL)
      c->dtypes[op] &= ~BIT(dt);
}

void dspk__caps_add_lang(struct dspk__devcaps *c, const char *lang) {
  int i = dspk__choice_find(dspk__kernel_langs, lang, strlen(lang));
  if (i < 0)
    return;
  c->langs |= 1u << i;
  c->dtypes[DSPK_OP_KERNEL] = dspk__op_dtypes[DSPK_OP_KERNEL];
}

/* Writes the names of the set bits of mask (of list) into buf: "f32, f64". */
static void names(char *buf, size_t len, uint32_t mask, const char *(*name)(int), int n) {
  size_t at = 0;
  buf[0] = '\0';
  for (int i = 0; i < n && at < len; i++) {
    if (!(mask & (1u << i)))
      continue;
    int w = snprintf(buf + at, len - at, "%s%s", at ? ", " : "", name(i));
    if (w < 0)
      break;
    at += (size_t)w;
  }
}

static const char *dtype_name(int i) { return dspk__dtype_name((dspk_dtype)i); }
static const char *lang_name(int i) { return dspk__kernel_langs[i]; }

int dspk__caps_check(const struct dspk__devcaps *c, const struct dspk__op *op,
                     const char *who, char *msg, size_t msglen) {
  char have[96];
  int nlangs = 0;
  while (dspk__kernel_langs[nlangs])
    nlangs++;
  if ((unsigned)op->kind >= DSPK_OP_COUNT)
    return dspk__fail(msg, msglen, DSPK_ENOTSUP, "%s does not run op %d", who, (int)op->kind);
  const char *opname = dspk__op_names[op->kind];
  if (op->kind == DSPK_OP_KERNEL) {
    const char *lang = op->u.kernel.lang ? op->u.kernel.lang : "";
    int i = dspk__choice_find(dspk__kernel_langs, lang, strlen(lang));
    if (!c->dtypes[DSPK_OP_KERNEL] || !c->langs)
      return dspk__fail(msg, msglen, DSPK_ENOTSUP, "kernel: %s runs no raw kernels", who);
    if (i < 0 || !(c->langs & (1u << i))) {
      names(have, sizeof have, c->langs, lang_name, nlangs);
      return dspk__fail(msg, msglen, DSPK_ENOTSUP,
                        "kernel: %s takes lang %s, not \"%s\"", who, have, lang);
    }
    return 0;
  }
  if (!c->dtypes[op->kind])
    return dspk__fail(msg, msglen, DSPK_ENOTSUP, "%s: %s does not run %s", opname, who,
                      opname);
  if (op->nin < 1 || !(c->dtypes[op->kind] & BIT(op->in[0].dtype))) {
    names(have, sizeof have, c->dtypes[op->kind], dtype_name, DSPK_DTYPE_COUNT);
    return dspk__fail(msg, msglen, DSPK_ENOTSUP, "%s: %s does not run %s on %s (it takes %s)",
                      opname, who, opname, op->nin ? dspk__dtype_name(op->in[0].dtype) : "?",
                      have);
  }
  return 0;
}
