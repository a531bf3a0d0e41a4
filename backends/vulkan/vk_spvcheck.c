/*
 * The resources a client's SPIR-V module uses, checked against what the
 * daemon binds before a pipeline is made of it (raw kernels, docs/protocol.md
 * "kernel").  The daemon's pipeline layout has storage buffers at bindings
 * 0 .. nbind-1 of set 0 and one push-constant range of the scalars' bytes; a
 * shader that statically uses a resource the layout lacks is undefined
 * behaviour in Vulkan (lavapipe happens to ignore it, other drivers crash or
 * fault), so such a kernel is refused with EINVAL naming the resource.
 *
 * Only the few instructions that say so are read: OpEntryPoint (the entry's
 * interface, which from SPIR-V 1.4 on lists the global variables of the
 * entry point, glslang's every declared one), OpVariable and OpTypePointer
 * (storage classes), the DescriptorSet, Binding, Block/BufferBlock, Offset,
 * ArrayStride, MatrixStride and RowMajor/ColMajor decorations, given by
 * OpDecorate/OpMemberDecorate or through a decoration group
 * (OpDecorationGroup, OpGroupDecorate, OpGroupMemberDecorate), the types of
 * the push-constant block (its size: where its last member's last byte
 * ends, a matrix's columns, or rows, MatrixStride apart), and the
 * operands of the functions' instructions: a variable is used when one of
 * them names it (as the Vulkan specification's "statically used"), and from
 * 1.4 on is in the entry's interface.  The entry point's work-group size
 * (WorkgroupSize, LocalSize, LocalSizeId) and the bytes of the module's
 * Workgroup variables, used or not (each variable's size, no padding
 * between them), are
 * checked against the device's limits too: ELIMIT beyond them, which Vulkan
 * also leaves undefined.  Those checks see the values the driver sees: the
 * daemon passes no specialization, so a specialization constant is its
 * default, and an OpSpecConstantOp of integer arithmetic on such values is
 * computed (eval); a size or array length that cannot be computed so is
 * EINVAL, never passed unchecked.  The module has passed SPIRV-Tools'
 * validator first (vk_spvval.c), so it is well-formed; the bounds checks
 * here stay all the same.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <spirv/unified1/spirv.h>

#include "backends/vulkan/vk.h"
#include "dspk/errors.h"
#include "proto/utf8.h"
/* dspk__vk_capnames: every capability's number and name, generated from
 * spirv-headers' spirv.h (CMakeLists.txt), for messages. */
#include "vk_capnames.h"


/* SPIR-V's universal limit on ids (its specification, "Universal Limits"). */
#define ID_BOUND_MAX 4194303u

struct id {
  uint32_t def;     /* word index of the instruction that defines it; 0: none */
  int32_t set, bnd; /* DescriptorSet, Binding: -1 when absent */
  uint32_t stride;  /* ArrayStride */
  int64_t offset;   /* Offset of a decoration group (OpGroupMemberDecorate); -1 none */
  uint32_t mstride; /* MatrixStride of a decoration group; 0 none */
  uint8_t major;    /* RowMajor (2) or ColMajor (1) of a decoration group; 0 none */
  uint8_t block;    /* 1 Block, 2 BufferBlock */
  uint8_t ref;      /* named by an instruction of a function */
  uint8_t used;     /* by the entry point */
  uint8_t wgsize;   /* decorated BuiltIn WorkgroupSize */
  uint32_t mode;    /* of a function: word index of its LocalSize(Id) mode; 0 none */
  uint8_t ev;       /* a constant's value: 0 not yet evaluated, 1 val, 2 cannot be told */
  uint64_t val;     /* its bits, within its type's width */
};

struct mod {
  const uint32_t *w;
  size_t nw;
  uint32_t bound;
  struct id *ids;
};

static uint32_t op_of(uint32_t w) { return w & 0xffffu; }
static uint32_t len_of(uint32_t w) { return w >> 16; }

/* The defining instruction of id, or NULL. */
static const uint32_t *def_of(const struct mod *m, uint32_t id) {
  return id < m->bound && m->ids[id].def ? m->w + m->ids[id].def : NULL;
}

static int value_of(const struct mod *m, uint32_t id, uint64_t *v);
static int int_type(const struct mod *m, uint32_t type, uint32_t *width, int *sign);

/* What size_of gives for a type with an array whose length cannot be told. */
#define SIZE_UNKNOWN UINT64_MAX
/* The most bytes size_of counts exactly: SIZE_OVER stands for any size
 * above it (one that may not even fit in 64 bits), said as "more than
 * SIZE_CAP bytes". */
#define SIZE_CAP ((uint64_t)1 << 40)
#define SIZE_OVER (SIZE_CAP + 1)

/* The deepest nesting size_of reads: a type whose members or elements,
 * within one another, go deeper is not counted (SIZE_UNKNOWN). */
#define NEST_MAX 16

/* Whether the type nests arrays, vectors, matrices and structs within one
 * another more than NEST_MAX deep (the cause of SIZE_UNKNOWN that is not a
 * length), as size_of counts the depth. */
static bool too_deep(const struct mod *m, uint32_t id, int depth) {
  const uint32_t *t = def_of(m, id);
  if (depth > NEST_MAX)
    return true;
  if (!t)
    return false;
  uint32_t n = len_of(t[0]);
  switch (op_of(t[0])) {
  case SpvOpTypeVector:
  case SpvOpTypeMatrix:
  case SpvOpTypeArray: return n > 2 && too_deep(m, t[2], depth + 1);
  case SpvOpTypeStruct:
    for (uint32_t k = 0; k + 2 < n; k++)
      if (too_deep(m, t[2 + k], depth + 1))
        return true;
    return false;
  default: return false;
  }
}

/* The variable's name for a message: "NAME" (its OpName, escaped: a
 * client's text) followed by its id, or the id alone. */
static const char *var_name(const struct mod *m, uint32_t id, char *dst, size_t cap) {
  for (size_t i = 5; i < m->nw;) {
    uint32_t l = len_of(m->w[i]);
    if (l == 0 || i + l > m->nw)
      break;
    if (op_of(m->w[i]) == SpvOpFunction)
      break;
    if (op_of(m->w[i]) == SpvOpName && l >= 3 && m->w[i + 1] == id) {
      const char *str = (const char *)(m->w + i + 2);
      size_t n = strnlen(str, (size_t)(l - 2) * 4);
      if (n) {
        char echo[DSPK__ECHO_CAP(64)];
        snprintf(dst, cap, "\"%s\" (id %u)", dspk__utf8_echo(echo, sizeof echo, str, n, 64),
                 id);
        return dst;
      }
    }
    i += l;
  }
  snprintf(dst, cap, "%u", id);
  return dst;
}

/* A struct member's decorations that place it: Offset, and for a matrix
 * (or an array of them) MatrixStride and RowMajor. */
struct place {
  uint64_t off;     /* Offset; the end of the member before where it has none */
  uint32_t mstride; /* MatrixStride; 0: none (columns packed) */
  uint8_t rowmajor;
};

/* The decorations of member k of struct id, given by OpMemberDecorate or
 * through a decoration group (OpGroupMemberDecorate), into *p (its off
 * left as given where the member has no Offset). */
static void member_place(const struct mod *m, uint32_t id, uint32_t k, struct place *p) {
  for (size_t i = 5; i < m->nw;) {
    uint32_t op = op_of(m->w[i]), l = len_of(m->w[i]);
    const uint32_t *o = m->w + i;
    if (l == 0 || i + l > m->nw || op == SpvOpFunction)
      break;
    if (op == SpvOpMemberDecorate && l >= 4 && o[1] == id && o[2] == k) {
      if (l >= 5 && o[3] == SpvDecorationOffset)
        p->off = o[4];
      else if (l >= 5 && o[3] == SpvDecorationMatrixStride)
        p->mstride = o[4];
      else if (o[3] == SpvDecorationRowMajor || o[3] == SpvDecorationColMajor)
        p->rowmajor = o[3] == SpvDecorationRowMajor;
    }
    /* A group's decorations given to (struct, member) pairs. */
    if (op == SpvOpGroupMemberDecorate && l >= 2 && o[1] < m->bound) {
      const struct id *g = &m->ids[o[1]];
      for (uint32_t j = 2; j + 1 < l; j += 2)
        if (o[j] == id && o[j + 1] == k) {
          if (g->offset >= 0)
            p->off = (uint64_t)g->offset;
          if (g->mstride)
            p->mstride = g->mstride;
          if (g->major)
            p->rowmajor = g->major == 2;
        }
    }
    i += l;
  }
}

/* s, or SIZE_OVER when it is above SIZE_CAP. */
static uint64_t capped(uint64_t s) { return s > SIZE_CAP ? SIZE_OVER : s; }

/* Bytes the type occupies in a block (its last byte's end), or SIZE_OVER
 * where that is more than 2^40 (SIZE_CAP); 0 where it has none to count (a
 * runtime array, an unknown type); SIZE_UNKNOWN where it holds an array
 * whose length (a specialization constant at its default, or an expression
 * of them) cannot be evaluated or is below 1, or types nested more than 16
 * deep.  mstride and rowmajor: the MatrixStride and RowMajor of the struct
 * member that holds the type, which lay out its matrices (a matrix, or one
 * within arrays): its columns (rows where rowmajor) mstride bytes apart,
 * the last one ending its extent; packed where mstride is 0. */
static uint64_t size_of(const struct mod *m, uint32_t id, int depth, uint32_t mstride,
                        int rowmajor) {
  const uint32_t *t = def_of(m, id);
  if (depth > NEST_MAX)
    return SIZE_UNKNOWN; /* counted as 0, arrays nested deeper escaped the limits */
  if (!t)
    return 0;
  uint32_t n = len_of(t[0]);
  switch (op_of(t[0])) {
  case SpvOpTypeBool: return 4;
  case SpvOpTypeInt:
  case SpvOpTypeFloat: return n > 2 ? t[2] / 8 : 0;
  case SpvOpTypePointer: return 8;
  case SpvOpTypeVector:
  case SpvOpTypeMatrix: {
    if (op_of(t[0]) == SpvOpTypeMatrix && mstride && n > 3) {
      /* Columns of rows components each, or rows of columns components:
       * the last vector starts (count - 1) strides in. */
      const uint32_t *col = def_of(m, t[2]);
      if (!col || op_of(col[0]) != SpvOpTypeVector || len_of(col[0]) < 4)
        return 0;
      uint64_t cs = size_of(m, col[2], depth + 2, 0, 0);
      uint64_t vecs = rowmajor ? col[3] : t[3], comps = rowmajor ? t[3] : col[3];
      if (cs == SIZE_UNKNOWN)
        return SIZE_UNKNOWN;
      if (vecs == 0)
        return 0;
      if (vecs - 1 > SIZE_CAP / mstride || (cs && comps > SIZE_CAP / cs))
        return SIZE_OVER;
      return capped((vecs - 1) * mstride + comps * cs); /* each at most 2^40 */
    }
    /* A vector, or a matrix of packed columns. */
    uint64_t es = n > 3 ? size_of(m, t[2], depth + 1, 0, 0) : 0;
    if (es == SIZE_UNKNOWN)
      return SIZE_UNKNOWN;
    if (es && t[3] > SIZE_CAP / es)
      return SIZE_OVER;
    return capped(t[3] * es);
  }
  case SpvOpTypeArray: {
    /* The length: the value the driver sees (a specialization constant at
     * its default: the daemon passes no specialization). */
    uint64_t len, es;
    uint32_t width;
    int sign;
    const uint32_t *c = n > 3 ? def_of(m, t[3]) : NULL;
    if (!c || value_of(m, t[3], &len) || int_type(m, c[1], &width, &sign) || width < 8 ||
        len == 0 || (sign && len >> (width - 1)))
      return SIZE_UNKNOWN;
    if ((es = size_of(m, t[2], depth + 1, mstride, rowmajor)) == SIZE_UNKNOWN)
      return SIZE_UNKNOWN;
    uint64_t st = m->ids[id].stride ? m->ids[id].stride : es;
    if (st && len - 1 > SIZE_CAP / st)
      return SIZE_OVER;
    return capped((len - 1) * st + es); /* each at most 2^40 + 1 */
  }
  case SpvOpTypeStruct: {
    uint64_t end = 0, at = 0;
    for (uint32_t k = 0; k + 2 < n; k++) {
      struct place p = {.off = at};
      member_place(m, id, k, &p);
      uint64_t s = size_of(m, t[2 + k], depth + 1, p.mstride, p.rowmajor);
      if (s == SIZE_UNKNOWN)
        return SIZE_UNKNOWN;
      at = p.off + s; /* below 2^32 + 2^40 + 1 */
      if (at > end)
        end = at;
    }
    return capped(end);
  }
  default: return 0;
  }
}

/* Whether operand word k of an instruction of a function with opcode op
 * is a literal (a number, a mask) rather than an id. */
static int literal(uint32_t op, uint32_t k) {
  switch (op) {
  case SpvOpLine: return 1;
  case SpvOpExtInst: return k == 4;            /* the instruction's number */
  case SpvOpFunction: return k == 3;           /* function control */
  case SpvOpLoad: return k >= 4;               /* memory operands */
  case SpvOpStore: case SpvOpCopyMemory: return k >= 3;
  case SpvOpCopyMemorySized: return k >= 4;
  case SpvOpVectorShuffle: return k >= 5;      /* components */
  case SpvOpCompositeExtract: return k >= 4;   /* indexes */
  case SpvOpCompositeInsert: return k >= 5;
  case SpvOpLoopMerge: return k >= 3;          /* loop control */
  case SpvOpSelectionMerge: return k >= 2;
  case SpvOpSwitch: return k >= 3 && k % 2 == 1; /* the case values */
  default: return 0;
  }
}

/* The width (1 for a bool) and signedness of an integer or bool type;
 * -1 for any other type. */
static int int_type(const struct mod *m, uint32_t type, uint32_t *width, int *sign) {
  const uint32_t *t = def_of(m, type);
  if (t && op_of(t[0]) == SpvOpTypeBool) {
    *width = 1;
    *sign = 0;
    return 0;
  }
  if (!t || op_of(t[0]) != SpvOpTypeInt || len_of(t[0]) < 4 || t[2] == 0 || t[2] > 64)
    return -1;
  *width = t[2];
  *sign = t[3] != 0;
  return 0;
}

static uint64_t mask_to(uint64_t v, uint32_t width) {
  return width >= 64 ? v : v & (((uint64_t)1 << width) - 1);
}

/* v's bits of the given width read as a signed number. */
static int64_t sext(uint64_t v, uint32_t width) {
  if (width >= 64)
    return (int64_t)v;
  uint64_t s = (uint64_t)1 << (width - 1);
  return (int64_t)((mask_to(v, width) ^ s) - s);
}

/* The opcodes of OpSpecConstantOp evaluated (SPIR-V's numbers). */
enum {
  SO_UCONVERT = 113, SO_SCONVERT = 114, SO_SNEGATE = 126, SO_IADD = 128, SO_ISUB = 130,
  SO_IMUL = 132, SO_UDIV = 134, SO_SDIV = 135, SO_UMOD = 137, SO_SREM = 138, SO_SMOD = 139,
  SO_LOGICALEQUAL = 164, SO_LOGICALNOTEQUAL = 165, SO_LOGICALOR = 166, SO_LOGICALAND = 167,
  SO_LOGICALNOT = 168, SO_SELECT = 169, SO_IEQUAL = 170, SO_INOTEQUAL = 171,
  SO_UGREATERTHAN = 172, SO_SGREATERTHAN = 173, SO_UGREATERTHANEQUAL = 174,
  SO_SGREATERTHANEQUAL = 175, SO_ULESSTHAN = 176, SO_SLESSTHAN = 177,
  SO_ULESSTHANEQUAL = 178, SO_SLESSTHANEQUAL = 179, SO_SHIFTRIGHTLOGICAL = 194,
  SO_SHIFTRIGHTARITHMETIC = 195, SO_SHIFTLEFTLOGICAL = 196, SO_BITWISEOR = 197,
  SO_BITWISEXOR = 198, SO_BITWISEAND = 199, SO_NOT = 200,
};

/* Evaluates the integer or bool scalar constant of c (its instruction):
 * 0 and *v, or -1 where it cannot be told. */
static int eval(const struct mod *m, const uint32_t *c, int depth, uint64_t *v);

/* The value of scalar constant id as the driver sees it (OpConstant;
 * OpSpecConstant, -True, -False at their defaults: the daemon passes no
 * specialization; OpSpecConstantOp of integer arithmetic, comparisons,
 * logic and OpCompositeExtract over those, computed in the result's width
 * as the specification defines): 0 and *v (its bits, within the type's
 * width), or -1 where it cannot be told (another kind of constant or
 * operation, a division by zero, a shift by the width or more, a chain
 * deeper than 64).  Each id is evaluated once (m->ids[].ev), so that a
 * module of shared subexpressions costs its size, not their paths. */
static int eval_id(const struct mod *m, uint32_t id, int depth, uint64_t *v) {
  const uint32_t *c = def_of(m, id);
  if (!c || depth > 64)
    return -1;
  struct id *e = &m->ids[id];
  if (e->ev == 0) {
    uint64_t x;
    e->ev = 2; /* also while being evaluated: a cycle cannot be told */
    if (eval(m, c, depth, &x) == 0) {
      e->ev = 1;
      e->val = x;
    }
  }
  *v = e->val;
  return e->ev == 1 ? 0 : -1;
}

static int value_of(const struct mod *m, uint32_t id, uint64_t *v) {
  return eval_id(m, id, 0, v);
}

static int eval(const struct mod *m, const uint32_t *c, int depth, uint64_t *v) {
  uint32_t op = op_of(c[0]), n = len_of(c[0]), w, wa = 0;
  int sg, sa = 0;
  if (n < 3 || int_type(m, c[1], &w, &sg))
    return -1;
  switch (op) {
  case SpvOpConstantTrue: case SpvOpSpecConstantTrue: *v = 1; return 0;
  case SpvOpConstantFalse: case SpvOpSpecConstantFalse: case SpvOpConstantNull: *v = 0; return 0;
  case SpvOpConstant: case SpvOpSpecConstant:
    if (n < 4 || w == 1)
      return -1;
    *v = mask_to(w > 32 && n >= 5 ? (uint64_t)c[4] << 32 | c[3] : c[3], w);
    return 0;
  case SpvOpSpecConstantOp: break;
  default: return -1;
  }
  if (n < 5)
    return -1;
  uint32_t so = c[3];
  uint64_t a = 0, b = 0, r;
  if (so == 81 /* OpCompositeExtract: a composite constant, literal indexes */) {
    uint32_t id = c[4];
    for (uint32_t k = 5; k < n; k++) {
      const uint32_t *x = def_of(m, id);
      if (!x || (op_of(x[0]) != SpvOpConstantComposite &&
                 op_of(x[0]) != SpvOpSpecConstantComposite) || 3 + (uint64_t)c[k] >= len_of(x[0]))
        return -1;
      id = x[3 + c[k]];
    }
    if (eval_id(m, id, depth + 1, &r))
      return -1;
    *v = mask_to(r, w);
    return 0;
  }
  /* The operands: ids of scalar constants. */
  if (eval_id(m, c[4], depth + 1, &a) || int_type(m, def_of(m, c[4])[1], &wa, &sa))
    return -1;
  if (n >= 6 && so != SO_SELECT && eval_id(m, c[5], depth + 1, &b))
    return -1;
  int64_t x = sext(a, wa), y = 0;
  uint32_t wb = 0;
  int sb;
  if (n >= 6 && so != SO_SELECT) {
    if (int_type(m, def_of(m, c[5])[1], &wb, &sb))
      return -1;
    y = sext(b, wb);
  }
  int two = n >= 6; /* a second operand */
  switch (so) {
  case SO_UCONVERT: r = a; break;
  case SO_SCONVERT: r = (uint64_t)x; break;
  case SO_SNEGATE: r = 0 - a; break;
  case SO_NOT: r = ~a; break;
  case SO_LOGICALNOT: r = !a; break;
  case SO_SELECT: {
    uint64_t p, q;
    if (n < 7 || eval_id(m, c[5], depth + 1, &p) || eval_id(m, c[6], depth + 1, &q))
      return -1;
    r = a ? p : q;
    break;
  }
  default:
    if (!two)
      return -1;
    switch (so) {
    case SO_IADD: r = a + b; break;
    case SO_ISUB: r = a - b; break;
    case SO_IMUL: r = a * b; break;
    case SO_UDIV: if (!b) return -1; r = a / b; break;
    case SO_UMOD: if (!b) return -1; r = a % b; break;
    case SO_SDIV:
    case SO_SREM:
    case SO_SMOD:
      /* Division by zero is undefined, so is the overflow of the most
       * negative number by -1. */
      if (!y || (y == -1 && x == INT64_MIN))
        return -1;
      if (so == SO_SDIV) {
        r = (uint64_t)(x / y);
      } else {
        int64_t q = x % y; /* SRem: the sign of x */
        if (so == SO_SMOD && q && ((q < 0) != (y < 0)))
          q += y; /* SMod: the sign of y */
        r = (uint64_t)q;
      }
      break;
    case SO_SHIFTRIGHTLOGICAL:
    case SO_SHIFTRIGHTARITHMETIC:
    case SO_SHIFTLEFTLOGICAL:
      if (b >= wa) /* undefined */
        return -1;
      r = so == SO_SHIFTLEFTLOGICAL ? a << b
          : so == SO_SHIFTRIGHTLOGICAL ? a >> b
          : (uint64_t)(x < 0 ? ~(~x >> b) : x >> b);
      break;
    case SO_BITWISEOR: r = a | b; break;
    case SO_BITWISEXOR: r = a ^ b; break;
    case SO_BITWISEAND: r = a & b; break;
    case SO_LOGICALEQUAL: case SO_IEQUAL: r = a == b; break;
    case SO_LOGICALNOTEQUAL: case SO_INOTEQUAL: r = a != b; break;
    case SO_LOGICALOR: r = a || b; break;
    case SO_LOGICALAND: r = a && b; break;
    case SO_UGREATERTHAN: r = a > b; break;
    case SO_SGREATERTHAN: r = x > y; break;
    case SO_UGREATERTHANEQUAL: r = a >= b; break;
    case SO_SGREATERTHANEQUAL: r = x >= y; break;
    case SO_ULESSTHAN: r = a < b; break;
    case SO_SLESSTHAN: r = x < y; break;
    case SO_ULESSTHANEQUAL: r = a <= b; break;
    case SO_SLESSTHANEQUAL: r = x <= y; break;
    default: return -1;
    }
  }
  (void)sg;
  *v = mask_to(r, w);
  return 0;
}

/* The entry point's work-group size (an object decorated WorkgroupSize, else
 * its LocalSize or LocalSizeId mode; a specialization constant at its
 * default, as the driver sees it without specialization) against the
 * device's limits: 0 when it fits or is not told, DSPK_ELIMIT with msg
 * (Vulkan leaves a pipeline beyond them undefined; lavapipe ran 65536
 * invocations silently), DSPK_EINVAL where a dimension is an expression
 * that cannot be evaluated (eval_id) or is 0. */
static int local_size(const struct mod *m, const uint32_t *ep, const VkPhysicalDeviceLimits *lim,
                      char *msg, size_t msglen) {
  uint64_t sz[3];
  int told = 0, bad = 0;
  for (uint32_t id = 1; id < m->bound && !told; id++) {
    if (!m->ids[id].wgsize)
      continue;
    /* The WorkgroupSize object wins over the mode, whatever it is: one
     * that is not a composite of 3 evaluable constants cannot be told. */
    const uint32_t *c = def_of(m, id);
    told = 1;
    if (!c || (op_of(c[0]) != SpvOpConstantComposite && op_of(c[0]) != SpvOpSpecConstantComposite) ||
        len_of(c[0]) < 6) {
      bad = 1;
      break;
    }
    for (int k = 0; k < 3; k++)
      bad |= value_of(m, c[3 + k], &sz[k]) != 0;
  }
  uint32_t fn = ep[2];
  if (!told && fn < m->bound && m->ids[fn].mode) {
    const uint32_t *o = m->w + m->ids[fn].mode;
    told = 1;
    for (int k = 0; k < 3; k++) {
      if (op_of(o[0]) == SpvOpExecutionMode)
        sz[k] = o[3 + k];
      else
        bad |= value_of(m, o[3 + k], &sz[k]) != 0;
    }
  }
  if (!told)
    return 0; /* spirv-val requires one for Vulkan */
  if (bad || !sz[0] || !sz[1] || !sz[2])
    return dspk__fail(msg, msglen, DSPK_EINVAL,
                      "kernel: the shader's work-group size cannot be told before the "
                      "pipeline is made (a dimension of 0, or a specialization-constant "
                      "expression other than integer arithmetic on specialization "
                      "constants' defaults): give it as constants or specialization "
                      "constants");
  const uint32_t *mx = lim->maxComputeWorkGroupSize;
  /* Each dimension within its limit is below 2^32: no product overflows. */
  if (sz[0] > mx[0] || sz[1] > mx[1] || sz[2] > mx[2] ||
      sz[0] * sz[1] > lim->maxComputeWorkGroupInvocations ||
      sz[0] * sz[1] * sz[2] > lim->maxComputeWorkGroupInvocations)
    return dspk__fail(msg, msglen, DSPK_ELIMIT,
                      "kernel: the shader's work-group size %llux%llux%llu exceeds the "
                      "device's maxComputeWorkGroupSize %ux%ux%u or "
                      "maxComputeWorkGroupInvocations %u",
                      (unsigned long long)sz[0], (unsigned long long)sz[1],
                      (unsigned long long)sz[2], mx[0], mx[1], mx[2],
                      lim->maxComputeWorkGroupInvocations);
  return 0;
}

int dspk__vk_spv_check(const uint32_t *w, size_t nw, const char *entry, int nbind,
                       uint32_t pcsize, const VkPhysicalDeviceLimits *lim, char *msg,
                       size_t msglen) {
  struct mod m = {.w = w, .nw = nw};
  int r = 0;
  if (nw < 5 || w[0] != 0x07230203 || w[3] == 0 || w[3] > ID_BOUND_MAX)
    return 0; /* not after validation (vk_spvval.c) */
  m.bound = w[3];
  if (!(m.ids = calloc(m.bound, sizeof *m.ids)))
    return DSPK_ENOMEM;
  for (uint32_t i = 0; i < m.bound; i++) {
    m.ids[i].set = m.ids[i].bnd = -1;
    m.ids[i].offset = -1;
  }

  /* Definitions and decorations; the entry point's interface. */
  int interface = w[1] >= 0x00010400u; /* SPIR-V 1.4: lists every global used */
  const uint32_t *ep = NULL;
  size_t first_fn = nw;
  for (size_t i = 5; i < nw;) {
    uint32_t op = op_of(w[i]), l = len_of(w[i]);
    if (l == 0 || i + l > nw)
      goto out; /* malformed: not after validation */
    const uint32_t *o = w + i;
    switch (op) {
    case SpvOpEntryPoint:
      if (l >= 4 && !ep && o[1] == SpvExecutionModelGLCompute) {
        size_t sl = strnlen((const char *)(o + 3), (l - 3) * 4);
        if (sl < (l - 3) * 4 && strcmp((const char *)(o + 3), entry) == 0)
          ep = o;
      }
      break;
    case SpvOpTypeBool: case SpvOpTypeInt: case SpvOpTypeFloat: case SpvOpTypeVector:
    case SpvOpTypeMatrix: case SpvOpTypeArray: case SpvOpTypeRuntimeArray: case SpvOpTypeStruct:
    case SpvOpTypePointer:
      if (l >= 2 && o[1] < m.bound)
        m.ids[o[1]].def = (uint32_t)i;
      break;
    case SpvOpExecutionMode:
    case SpvOpExecutionModeId:
      if (l >= 6 && o[1] < m.bound &&
          o[2] == (op == SpvOpExecutionMode ? SpvExecutionModeLocalSize : SpvExecutionModeLocalSizeId))
        m.ids[o[1]].mode = (uint32_t)i;
      break;
    case SpvOpConstantTrue:
    case SpvOpConstantFalse:
    case SpvOpConstant:
    case SpvOpConstantNull:
    case SpvOpSpecConstantTrue:
    case SpvOpSpecConstantFalse:
    case SpvOpSpecConstant:
    case SpvOpSpecConstantOp:
    case SpvOpConstantComposite:
    case SpvOpSpecConstantComposite:
    case SpvOpVariable:
      if (l >= 4 && o[2] < m.bound)
        m.ids[o[2]].def = (uint32_t)i;
      break;
    case SpvOpDecorate:
      if (l >= 3 && o[1] < m.bound) {
        struct id *d = &m.ids[o[1]];
        if (o[2] == SpvDecorationBlock)
          d->block = 1;
        else if (o[2] == SpvDecorationBufferBlock)
          d->block = 2;
        else if (l >= 4 && o[2] == SpvDecorationBinding)
          d->bnd = (int32_t)(o[3] & 0x7fffffff);
        else if (l >= 4 && o[2] == SpvDecorationDescriptorSet)
          d->set = (int32_t)(o[3] & 0x7fffffff);
        else if (l >= 4 && o[2] == SpvDecorationArrayStride)
          d->stride = o[3];
        else if (l >= 4 && o[2] == SpvDecorationOffset)
          d->offset = o[3]; /* read for a decoration group only, as the next three */
        else if (l >= 4 && o[2] == SpvDecorationMatrixStride)
          d->mstride = o[3];
        else if (o[2] == SpvDecorationRowMajor || o[2] == SpvDecorationColMajor)
          d->major = o[2] == SpvDecorationRowMajor ? 2 : 1;
        else if (l >= 4 && o[2] == SpvDecorationBuiltIn && o[3] == SpvBuiltInWorkgroupSize)
          d->wgsize = 1;
      }
      break;
    case SpvOpGroupDecorate:
      /* The group's decorations (given to the group's id before this
       * instruction, as SPIR-V's layout requires) to each target. */
      if (l >= 2 && o[1] < m.bound) {
        const struct id *g = &m.ids[o[1]];
        for (uint32_t k = 2; k < l; k++) {
          if (o[k] >= m.bound)
            continue;
          struct id *d = &m.ids[o[k]];
          if (g->block)
            d->block = g->block;
          if (g->bnd >= 0)
            d->bnd = g->bnd;
          if (g->set >= 0)
            d->set = g->set;
          if (g->stride)
            d->stride = g->stride;
        }
      }
      break;
    case SpvOpFunction:
      if (first_fn == nw)
        first_fn = i;
      break;
    default: break;
    }
    i += l;
  }
  if (!ep) {
    /* Vulkan leaves a pipeline of an entry point the module lacks undefined
     * (VkPipelineShaderStageCreateInfo::pName). */
    char echo[DSPK__ECHO_CAP(64)]; /* entry: a client's string (options.entry) */
    snprintf(msg, msglen, "spirv: the module has no GLCompute entry point \"%s\"",
             dspk__utf8_echo(echo, sizeof echo, entry, strlen(entry), 64));
    r = DSPK_ECOMPILE;
    goto out;
  }

  /* Which variables the entry point uses: those an instruction of a function
   * names (the operands that are literals skipped, so that a number is not
   * taken for an id), and from SPIR-V 1.4 on only those of the entry's
   * interface (glslang lists every variable declared there, used or not). */
  for (size_t i = first_fn; i < nw;) {
    uint32_t op = op_of(w[i]), l = len_of(w[i]);
    if (l == 0 || i + l > nw)
      break;
    for (uint32_t k = 1; k < l; k++)
      if (!literal(op, k) && w[i + k] < m.bound)
        m.ids[w[i + k]].ref = 1;
    i += l;
  }
  if (interface) {
    size_t l = len_of(ep[0]), sl = strlen((const char *)(ep + 3)) / 4 + 1;
    for (size_t k = 3 + sl; k < l; k++)
      if (ep[k] < m.bound)
        m.ids[ep[k]].used = m.ids[ep[k]].ref;
  } else {
    for (uint32_t id = 0; id < m.bound; id++)
      m.ids[id].used = m.ids[id].ref;
  }

  if (lim && (r = local_size(&m, ep, lim, msg, msglen)))
    goto out;
  uint32_t pcmax = (pcsize + 3) & ~3u;
  int32_t unbound = -1;
  uint64_t shared = 0;
  for (uint32_t id = 1; id < m.bound && !r; id++) {
    const uint32_t *v = def_of(&m, id);
    if (!v || op_of(v[0]) != SpvOpVariable)
      continue;
    uint32_t sc = v[3];
    /* Every Workgroup variable counts, used or not: the zero-initialising
     * rewrite (vk_spvzero.c) gives each an initializer, which the driver
     * honours (lavapipe: an unused `shared float s[1 << 22]` took the
     * daemon's process 2.3 GiB and 82 s). */
    if (!m.ids[id].used && sc != SpvStorageClassWorkgroup)
      continue;
    const uint32_t *p = def_of(&m, v[1]);
    uint32_t pointee = p && op_of(p[0]) == SpvOpTypePointer && len_of(p[0]) >= 4 ? p[3] : 0;
    const uint32_t *t = def_of(&m, pointee);
    int32_t set = m.ids[id].set, bnd = m.ids[id].bnd;
    if ((sc == SpvStorageClassPushConstant || sc == SpvStorageClassWorkgroup) &&
        size_of(&m, pointee, 0, 0, 0) == SIZE_UNKNOWN) {
      /* Its size must be the driver's: refused where it cannot be told. */
      char name[DSPK__ECHO_CAP(64) + 32];
      const char *what = sc == SpvStorageClassWorkgroup ? "shared (Workgroup)" : "push-constant";
      var_name(&m, id, name, sizeof name);
      if (too_deep(&m, pointee, 0))
        snprintf(msg, msglen,
                 "kernel: the shader's %s variable %s nests its types (arrays, structs, "
                 "vectors, matrices within one another) more than %d deep, the most the "
                 "daemon reads to count its size: nest them less deep",
                 what, name, NEST_MAX);
      else
        snprintf(msg, msglen,
                 "kernel: the shader's %s variable %s holds an array whose length cannot be "
                 "told before the pipeline is made (below 1, or a specialization-constant "
                 "expression other than integer arithmetic on specialization constants' "
                 "defaults): give it a constant or specialization-constant length",
                 what, name);
      r = DSPK_EINVAL;
      continue;
    }
    if (sc == SpvStorageClassPushConstant) {
      uint64_t s = size_of(&m, pointee, 0, 0, 0);
      if (s > pcmax) {
        snprintf(msg, msglen,
                 "kernel: the shader's push-constant block is %s%llu bytes, the scalars of "
                 "args fill %u: pass a scalar for each of its members",
                 s == SIZE_OVER ? "more than " : "",
                 (unsigned long long)(s == SIZE_OVER ? SIZE_CAP : s), pcsize);
        r = DSPK_EINVAL;
      }
      continue;
    }
    if (sc == SpvStorageClassWorkgroup) /* each at most SIZE_OVER: no overflow */
      shared = capped(shared + size_of(&m, pointee, 0, 0, 0));
    if (sc != SpvStorageClassUniformConstant && sc != SpvStorageClassUniform && sc != SpvStorageClassStorageBuffer)
      continue;
    if (set < 0 || bnd < 0) {
      snprintf(msg, msglen,
               "kernel: the shader uses a resource without a binding (and set): tensors are "
               "storage buffers at bindings 0, 1, ... of set 0");
      r = DSPK_EINVAL;
    } else if (t && (op_of(t[0]) == SpvOpTypeArray || op_of(t[0]) == SpvOpTypeRuntimeArray)) {
      snprintf(msg, msglen,
               "kernel: the shader uses an array of resources at set %d, binding %d: each "
               "tensor is one storage buffer", set, bnd);
      r = DSPK_EINVAL;
    } else if (sc == SpvStorageClassUniformConstant ||
               (sc == SpvStorageClassUniform && !(t && m.ids[pointee].block == 2))) {
      snprintf(msg, msglen,
               "kernel: the shader uses %s at set %d, binding %d: tensors are bound as "
               "storage buffers only (declare it `buffer`)",
               sc == SpvStorageClassUniform ? "a uniform buffer" : "an image or sampler", set, bnd);
      r = DSPK_EINVAL;
    } else if (set != 0) {
      snprintf(msg, msglen,
               "kernel: the shader uses descriptor set %d (binding %d): tensors are bound "
               "in set 0 only", set, bnd);
      r = DSPK_EINVAL;
    } else if (bnd >= nbind && (unbound < 0 || bnd < unbound)) {
      unbound = bnd; /* the lowest one is named, after the other checks */
    }
  }
  if (!r && lim && shared > lim->maxComputeSharedMemorySize) {
    snprintf(msg, msglen,
             "kernel: the shader's shared (Workgroup) variables take %s%llu bytes, more than "
             "the device's maxComputeSharedMemorySize %u",
             shared == SIZE_OVER ? "more than " : "",
             (unsigned long long)(shared == SIZE_OVER ? SIZE_CAP : shared),
             lim->maxComputeSharedMemorySize);
    r = DSPK_ELIMIT;
  }
  if (!r && unbound >= 0) {
    if (nbind)
      snprintf(msg, msglen,
               "kernel: the shader uses binding %d, but args pass %d tensor%s (bindings 0 "
               "to %d): pass a tensor for each binding the shader uses",
               unbound, nbind, nbind == 1 ? "" : "s", nbind - 1);
    else
      snprintf(msg, msglen,
               "kernel: the shader uses binding %d, but args pass no tensor: pass a tensor "
               "for each binding the shader uses", unbound);
    r = DSPK_EINVAL;
  }
out:
  free(m.ids);
  return r;
}

/* See vk.h.  OpSourceExtension (4) is valid in every SPIR-V version and
 * belongs to the first group of debug instructions, right after the
 * capabilities, extensions, imports, memory model, entry points and
 * execution modes (the module's logical layout). */
int dspk__vk_spv_mark(const uint32_t *w, size_t nw, const char *text, uint32_t **out,
                      size_t *outnw) {
  size_t tlen = strlen(text), tw = tlen / 4 + 1, at = nw, i = 5;
  uint32_t *o;
  if (nw >= 5 && w[0] == 0x07230203) {
    while (i < nw) {
      uint32_t op = w[i] & 0xffff, len = w[i] >> 16;
      /* OpCapability, OpExtension, OpExtInstImport, OpMemoryModel,
       * OpEntryPoint, OpExecutionMode, OpExecutionModeId. */
      if (len == 0 || i + len > nw ||
          !(op == 17 || op == 10 || op == 11 || op == 14 || op == 15 || op == 16 || op == 331))
        break;
      i += len;
    }
    at = i;
  }
  if (at >= nw || nw < 5 || w[0] != 0x07230203) { /* unreadable: as it is */
    if (!(o = malloc(nw * sizeof *o)))
      return DSPK_ENOMEM;
    memcpy(o, w, nw * sizeof *o);
    *out = o;
    *outnw = nw;
    return 0;
  }
  if (!(o = calloc(nw + 1 + tw, sizeof *o)))
    return DSPK_ENOMEM;
  memcpy(o, w, at * sizeof *o);
  o[at] = (uint32_t)(1 + tw) << 16 | 4u;
  memcpy(o + at + 1, text, tlen); /* NUL-padded by calloc */
  memcpy(o + at + 1 + tw, w + at, (nw - at) * sizeof *o);
  *out = o;
  *outnw = nw + 1 + tw;
  return 0;
}

/* The name of capability c (the first spirv.h gives its number), or NULL
 * for a number SPIR-V does not define. */
static const char *cap_name(uint32_t c) {
  for (size_t i = 0; i < sizeof dspk__vk_capnames / sizeof dspk__vk_capnames[0]; i++)
    if (dspk__vk_capnames[i].c == c)
      return dspk__vk_capnames[i].name;
  return NULL;
}

/* See vk.h.  Capabilities open a module (its logical layout), so the scan
 * stops at the first other instruction. */
int dspk__vk_spv_caps(const uint32_t *w, size_t nw, const uint32_t *ok, int nok, char *msg,
                      size_t msglen) {
  for (size_t i = 5; i < nw;) {
    uint32_t op = w[i] & 0xffff, len = w[i] >> 16;
    if (op != 17 || len < 2 || i + len > nw)
      break;
    uint32_t c = w[i + 1];
    int found = 0;
    for (int k = 0; k < nok && !found; k++)
      found = ok[k] == c;
    if (!found) {
      char list[512] = "";
      size_t at = 0;
      for (int k = 0; k < nok && at < sizeof list; k++) {
        const char *n = cap_name(ok[k]);
        int m = n ? snprintf(list + at, sizeof list - at, "%s%s", k ? ", " : "", n)
                  : snprintf(list + at, sizeof list - at, "%s%u", k ? ", " : "", ok[k]);
        if (m < 0)
          break;
        at += (size_t)m;
      }
      const char *n = cap_name(c);
      if (n)
        snprintf(msg, msglen,
                 "kernel: the shader declares capability %s (%u), which this device does not "
                 "enable for kernels (it enables %s)",
                 n, c, list);
      else
        snprintf(msg, msglen,
                 "kernel: the shader declares capability %u, which this device does not enable "
                 "for kernels (it enables %s)",
                 c, list);
      return DSPK_ENOTSUP;
    }
    i += len;
  }
  return 0;
}
