/*
 * The kernel source generator of kernels.h: prepends a dtype block and the
 * prelude to a family's embedded file.  The result is what gets hashed into
 * cache keys, so it must depend on nothing but (family, dtype) and the files.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/kernels/kernels.h"
#include "dspk/errors.h"

static const char *const fam_names[DSPK__K_COUNT] = {"map", "reduce", "fir",
                                                     "permute", "gemm", "dft"};

const char *dspk__kfamily_name(enum dspk__kfamily f) {
  return (unsigned)f < DSPK__K_COUNT ? fam_names[f] : "?";
}

int dspk__kfamily_typed(enum dspk__kfamily f) { return f != DSPK__K_PERMUTE; }

static const struct dspk__kernel_file *find(const char *name) {
  for (const struct dspk__kernel_file *k = dspk__kernel_files; k->name; k++)
    if (strcmp(k->name, name) == 0)
      return k;
  return NULL;
}

int dspk__kernel_source(enum dspk__kfamily f, dspk_dtype dt, char **out,
                        size_t *len) {
  const struct dspk__kernel_file *pre = find("prelude.cuh"), *body;
  char file[32], head[256];
  const char *t, *r, *acc, *tn;
  int cplx, n;
  char *s;
  if ((unsigned)f >= DSPK__K_COUNT)
    return DSPK_EINVAL;
  snprintf(file, sizeof(file), "%s.cu", fam_names[f]);
  body = find(file);
  if (!pre || !body)
    return DSPK_ENOENT;
  if (!dspk__kfamily_typed(f)) {
    t = r = "float";
    acc = "double";
    tn = "none";
    cplx = 0;
  } else {
    switch (dt) {
    case DSPK_F32: t = r = "float"; acc = "double"; tn = "f32"; cplx = 0; break;
    case DSPK_F64: t = r = "double"; acc = "double"; tn = "f64"; cplx = 0; break;
    case DSPK_C64: t = "dspk_c64"; r = "float"; acc = "dspk_c128"; tn = "c64"; cplx = 1; break;
    case DSPK_C128: t = "dspk_c128"; r = "double"; acc = "dspk_c128"; tn = "c128"; cplx = 1; break;
    default: return DSPK_EDTYPE;
    }
  }
  n = snprintf(head, sizeof(head),
               "// dspk %s %s\n#define DSPK_T %s\n#define DSPK_R %s\n"
               "#define DSPK_ACC %s\n#define DSPK_COMPLEX %d\n",
               fam_names[f], tn, t, r, acc, cplx);
  s = malloc((size_t)n + pre->len + body->len + 2);
  if (!s)
    return DSPK_ENOMEM;
  memcpy(s, head, (size_t)n);
  memcpy(s + n, pre->text, pre->len);
  s[n + pre->len] = '\n';
  memcpy(s + n + pre->len + 1, body->text, body->len);
  *len = (size_t)n + pre->len + 1 + body->len;
  s[*len] = 0;
  *out = s;
  return 0;
}
