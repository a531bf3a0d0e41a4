/*
 * The ops of the GPU runtimes, enqueued on the device's stream: gemm
 * through the runtime's BLAS (cuBLAS, hipBLAS) or our own kernel, fft
 * through its FFT library (cuFFT, hipFFT: plans in an LRU cache, work areas
 * from the pool) or our own direct transform, fir/reduce/map through the
 * generated kernels of backends/kernels/ (NVRTC, hiprtc), contract as
 * reduce + permutation kernels + strided-batched gemm with an LRU plan cache whose evictions retire
 * the plan's workspaces through the retirement queue, and raw CUDA C / HIP C++
 * kernels.  Semantics follow the cpu backend (backends/op.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/gpurt/gpurt.h"
#include "backends/common/autotune.h"
#include "cache/cache.h"
#include "proto/utf8.h"

#define DRV (dev->drv)

/* Mirrors of the kernels' parameter structs (backends/kernels/). */
struct rdesc {
  int nkeep, nred;
  int64_t keep_shape[8], keep_stride[8], red_shape[8], red_stride[8];
  int64_t nout, nred_total;
};
struct pdesc {
  int rank;
  int64_t shape[8], stride[8];
  int64_t n;
};

static int blas_err(struct dspk__dev *dev, struct dspk__opctx *ctx, int s) {
  return dspk__gpurt_msg(ctx, DSPK_EDEVICE, "gemm failed: %s status %d",
                         DRV->blas_name(), s);
}

/* C-order element strides of a shape. */
static void strides_of(const int64_t *shape, int rank, int64_t *st) {
  int64_t s = 1;
  for (int i = rank - 1; i >= 0; i--) {
    st[i] = s;
    s *= shape[i];
  }
}

/* Copies src (element size esz) into the contiguous dst of shape d->shape,
 * reading src at d->stride (0 broadcasts). */
static int permute(struct dspk__dev *dev, dspk__gptr src, dspk__gptr dst,
                   size_t esz, struct pdesc *d, struct dspk__opctx *ctx) {
  char entry[32];
  dspk__gfunc fn;
  void *args[3] = {&src, &dst, d};
  int rc;
  d->n = 1;
  for (int i = 0; i < d->rank; i++)
    d->n *= d->shape[i];
  if (d->n == 0)
    return 0;
  snprintf(entry, sizeof(entry), "dspk_permute_%zu", esz);
  if ((rc = dspk__gpurt_kfunc(dev, DSPK__K_PERMUTE, DSPK_F32, entry, &fn, ctx)))
    return rc;
  return dspk__gpurt_launch1d(dev, fn, d->n, args, ctx);
}

static int map_scale(struct dspk__dev *dev, dspk__gptr p, dspk_dtype dt,
                     int64_t n, double alpha, struct dspk__opctx *ctx) {
  dspk__gfunc fn;
  void *args[5] = {&p, &p, &p, &n, &alpha};
  int rc = dspk__gpurt_kfunc(dev, DSPK__K_MAP, dt, "dspk_map_scale", &fn, ctx);
  return rc ? rc : dspk__gpurt_launch1d(dev, fn, n, args, ctx);
}

/* ---- gemm ---------------------------------------------------------------- */

/* Small products go to our tiled kernel even where the runtime has a BLAS:
 * up to dev->gemm_small multiply-adds (0: never), where the BLAS call's
 * host work is most of the product's cost (docs/backends.md). */
static int own_gemm_fits(const struct dspk__dev *dev, dspk_dtype dt, int64_t M, int64_t N,
                         int64_t K, int64_t batch) {
  if (dev->gemm_small <= 0 ||
      (dt != DSPK_F32 && dt != DSPK_F64 && dt != DSPK_C64 && dt != DSPK_C128))
    return 0;
  return (double)M * (double)N * (double)K * (double)batch <= (double)dev->gemm_small;
}

/* One strided-batched gemm in row-major terms: C[b] (M,N) = alpha op(A[b])
 * op(B[b]) + beta C[b], through BLAS's column-major C^T = op(B)^T op(A)^T:
 * the runtime's BLAS when it has one and the product is not small, else our
 * own tiled kernel (kernels/gemm.cu, f32/f64/c64/c128). */
static int gemm_rm(struct dspk__dev *dev, dspk_dtype dt, int ta, int tb,
                   int64_t M, int64_t N, int64_t K, double alpha,
                   dspk__gptr A, int64_t sa, dspk__gptr B, int64_t sb,
                   double beta, dspk__gptr C, int64_t sc, int64_t batch,
                   struct dspk__opctx *ctx) {
  int64_t lda = ta ? M : K, ldb = tb ? K : N, ldc = N;
  int s, rc;
  if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX || batch > INT32_MAX)
    return dspk__gpurt_msg(ctx, DSPK_ELIMIT, "gemm: a dimension exceeds 2^31-1");
  if (lda < 1) lda = 1;
  if (ldb < 1) ldb = 1;
  if (ldc < 1) ldc = 1;
  if (dev->blas && !dev->own_kernels && !own_gemm_fits(dev, dt, M, N, K, batch)) {
    s = DRV->blas_gemm(dev->blas, dt, tb, ta, (int)N, (int)M, (int)K, alpha, B, (int)ldb, sb,
                       A, (int)lda, sa, beta, C, (int)ldc, sc, (int)batch);
    if (s == -1)
      return dspk__gpurt_msg(ctx, DSPK_EDTYPE, "gemm: dtype %s not supported on %s",
                             dspk__dtype_name(dt), DRV->name);
    return s ? blas_err(dev, ctx, s) : 0;
  }
  if (dt != DSPK_F32 && dt != DSPK_F64 && dt != DSPK_C64 && dt != DSPK_C128)
    return dspk__gpurt_msg(ctx, DSPK_ENOTSUP,
                           "gemm: %s in needs a BLAS library (none on this %s host)",
                           dspk__dtype_name(dt), DRV->name);
  {
    dspk__gfunc fn;
    int64_t m = N, n = M, k = K, nb = batch;
    /* 32x32 tiles; groups of 64 threads: 8 (real), 4 (complex), as
     * DSPK_GS in kernels/gemm.cu. */
    int64_t tiles = ((m + 31) / 32) * ((n + 31) / 32) * nb, cap = (int64_t)dev->sms * 4;
    unsigned threads = dspk__dtype_is_complex(dt) ? 256 : 512;
    int tx = tb, ty = ta, r;
    void *args[17] = {&B, &A, &C, &m, &n, &k, &ldb, &lda, &ldc, &sb, &sa, &sc, &nb,
                      &tx, &ty, &alpha, &beta};
    if ((rc = dspk__gpurt_kfunc(dev, DSPK__K_GEMM, dt, "dspk_gemm_tile", &fn, ctx)))
      return rc;
    if (tiles > cap)
      tiles = cap;
    r = DRV->launch(fn, (unsigned)(tiles > 0 ? tiles : 1), 1, 1, threads, 1, 1, 0, dev->stream,
                    args);
    return r ? dspk__gpurt_err(dev, ctx, "cuLaunchKernel", r) : 0;
  }
}

/* Maps output batch index b to the element offset of a batch operand T
 * (broadcast dims contribute 0); the last two dims are the matrix. */
static int64_t batch_offset(const struct dspk__tensor *T, const struct dspk__tensor *O,
                            int64_t b) {
  int64_t off = 0, st = T->shape[T->rank - 1] * T->shape[T->rank - 2];
  for (int i = O->rank - 3; i >= 0; i--) {
    int ti = i - (O->rank - T->rank);
    int64_t idx = b % O->shape[i];
    b /= O->shape[i];
    if (ti >= 0) {
      if (T->shape[ti] != 1)
        off += idx * st;
      st *= T->shape[ti];
    }
  }
  return off;
}

/* The constant batch stride of T against O, or -1 when none fits. */
static int64_t batch_stride(const struct dspk__tensor *T, const struct dspk__tensor *O) {
  int64_t nb = 1, mat = T->shape[T->rank - 1] * T->shape[T->rank - 2];
  for (int i = 0; i < T->rank - 2; i++)
    nb *= T->shape[i];
  if (nb == 1)
    return 0;
  if (T->rank != O->rank)
    return -1;
  for (int i = 0; i < T->rank - 2; i++)
    if (T->shape[i] != O->shape[i])
      return -1;
  return mat;
}

static int op_gemm(struct dspk__dev *dev, struct dspk__op *op, struct dspk__opctx *ctx) {
  const struct dspk__tensor *A = &op->in[0], *B = &op->in[1], *O = &op->out[0];
  int ta = op->u.gemm.trans_a != 0, tb = op->u.gemm.trans_b != 0;
  int64_t M = O->shape[O->rank - 2], N = O->shape[O->rank - 1];
  int64_t K = ta ? A->shape[A->rank - 2] : A->shape[A->rank - 1];
  int64_t nb = 1, sa, sb;
  size_t isz = dspk__dtype_size(A->dtype), osz = dspk__dtype_size(O->dtype);
  /* alpha and beta as the op computes with them (f32-rounded for an f32
   * product: 1e-50 is 0), on which "alpha 0 reads neither A nor B" and
   * "beta 0 reads no C" are decided; beta 0 without C. */
  double alpha, beta;
  int rc;
  dspk__op_gemm_scalars(op, &alpha, &beta);
  for (int i = 0; i < O->rank - 2; i++)
    nb *= O->shape[i];
  if (nb * M * N == 0)
    return 0;
  if (op->nin == 3) {
    /* out = broadcast(C), then the gemm accumulates into it with beta. */
    const struct dspk__tensor *C = &op->in[2];
    struct pdesc d = {0};
    int64_t cst[DSPK_MAX_RANK];
    strides_of(C->shape, C->rank, cst);
    d.rank = O->rank;
    for (int i = 0; i < O->rank; i++) {
      int ci = i - (O->rank - C->rank);
      d.shape[i] = O->shape[i];
      d.stride[i] = (ci >= 0 && C->shape[ci] != 1) ? cst[ci] : 0;
    }
    if ((rc = permute(dev, dspk__gpurt_ptr(C), dspk__gpurt_ptr(O), osz, &d, ctx)))
      return rc;
  }
  if (K == 0 || alpha == 0) {
    /* An empty sum, or alpha 0 of either sign (which reads neither A nor B,
     * as BLAS and the cpu): out = beta*C exactly, or +0 (beta 0 reads no C:
     * 0, not 0*NaN; no alpha*0 is added, so no -0 from a negative alpha). */
    if (beta != 0)
      return map_scale(dev, dspk__gpurt_ptr(O), O->dtype, nb * M * N, beta, ctx);
    int r = DRV->memset_async(dspk__gpurt_ptr(O), 0, (size_t)(nb * M * N) * osz, dev->stream);
    return r ? dspk__gpurt_err(dev, ctx, "cuMemsetD8Async", r) : 0;
  }
  sa = batch_stride(A, O);
  sb = batch_stride(B, O);
  if (sa >= 0 && sb >= 0)
    return gemm_rm(dev, A->dtype, ta, tb, M, N, K, alpha, dspk__gpurt_ptr(A), sa,
                   dspk__gpurt_ptr(B), sb, beta, dspk__gpurt_ptr(O), M * N, nb, ctx);
  /* Batch shapes that broadcast both ways: one gemm per output matrix. */
  for (int64_t b = 0; b < nb; b++) {
    rc = gemm_rm(dev, A->dtype, ta, tb, M, N, K, alpha,
                 dspk__gpurt_ptr(A) + (dspk__gptr)(batch_offset(A, O, b) * (int64_t)isz), 0,
                 dspk__gpurt_ptr(B) + (dspk__gptr)(batch_offset(B, O, b) * (int64_t)isz), 0,
                 beta, dspk__gpurt_ptr(O) + (dspk__gptr)(b * M * N * (int64_t)osz), 0, 1, ctx);
    if (rc)
      return rc;
  }
  return 0;
}

/* ---- fft ----------------------------------------------------------------- */

struct fftplan {
  void *h;
  struct dspk__pool_block *ws;
  struct dspk__dev *dev;
};

static void fftplan_release(void *ud, void *p) {
  struct fftplan *pl = p;
  (void)ud;
  pl->dev->drv->fft_destroy(pl->h);
  if (pl->ws)
    dspk__pool_put(&pl->dev->pool, pl->ws);
  free(pl);
}

void dspk__gpurt_fft_plan_evict(void *ud, void *plan) {
  /* The plan and its work area may still be in use by queued transforms. */
  dspk__gpurt_retire(ud, fftplan_release, NULL, plan);
}

/* Without an FFT library: the direct transform of kernels/dft.cu. */
static int fft_own(struct dspk__dev *dev, struct dspk__op *op, long long n, long long nout,
                   long long batch, struct dspk__opctx *ctx) {
  const struct dspk__tensor *X = &op->in[0], *Y = &op->out[0];
  dspk__gptr x = dspk__gpurt_ptr(X), y = dspk__gpurt_ptr(Y);
  int64_t nn = n, no = nout, nb = batch;
  double sign = op->u.fft.inverse ? 1.0 : -1.0;
  void *args[6] = {&x, &y, &nn, &no, &nb, &sign};
  dspk__gfunc fn;
  int rc;
  if ((rc = dspk__gpurt_kfunc(dev, DSPK__K_DFT, X->dtype, "dspk_dft", &fn, ctx)))
    return rc;
  return dspk__gpurt_launch1d(dev, fn, no * nb, args, ctx);
}

/* The cached FFT-library plan of batch transforms of kind t along
 * contiguous rows of n (inputs) and nout (outputs) elements, its stream set
 * and work area from the pool.  Also used by fir's FFT path (fir_fft.c). */
int dspk__gpurt_fft_plan(struct dspk__dev *dev, enum dspk__gfft type, long long n,
                         long long nout, long long batch, void **out,
                         struct dspk__opctx *ctx) {
  struct { int type; long long n, batch; } key;
  struct fftplan *pl;
  int s, rc;
  memset(&key, 0, sizeof(key));
  key.type = (int)type;
  key.n = n;
  key.batch = batch;
  pl = dspk__plancache_get(&dev->fft_plans, &key, sizeof(key));
  if (!pl) {
    size_t ws = 0;
    int oom = 0;
    pl = calloc(1, sizeof(*pl));
    if (!pl)
      return DSPK_ENOMEM;
    pl->dev = dev;
    s = DRV->fft_plan(&pl->h, type, n, batch, nout, &ws, dev->stream, &oom);
    if (s != 0) {
      free(pl);
      return dspk__gpurt_msg(ctx, oom ? DSPK_ENOMEM : DSPK_EDEVICE,
                             "fft: %s plan (n=%lld, batch=%lld) failed: %d",
                             DRV->fft_name(), n, batch, s);
    }
    if (ws > 0) {
      if ((rc = dspk__gpurt_tmp_alloc(dev, ws, &pl->ws))) {
        DRV->fft_destroy(pl->h);
        free(pl);
        return dspk__gpurt_msg(ctx, rc, "fft: no device memory for a %zu-byte work area", ws);
      }
      DRV->fft_set_work(pl->h, pl->ws->handle);
    }
    dspk__plancache_put(&dev->fft_plans, &key, sizeof(key), pl);
  }
  *out = pl->h;
  return 0;
}

static int op_fft(struct dspk__dev *dev, struct dspk__op *op, struct dspk__opctx *ctx) {
  const struct dspk__tensor *X = &op->in[0], *Y = &op->out[0];
  long long n = X->shape[X->rank - 1], nout = Y->shape[Y->rank - 1];
  long long batch = n ? dspk__tensor_numel(X) / n : 0;
  enum dspk__gfft type;
  void *h;
  int s, rc;
  dspk__gptr in = dspk__gpurt_ptr(X), out = dspk__gpurt_ptr(Y);
  if (batch == 0)
    return 0;
  switch (X->dtype) {
  case DSPK_C64: type = DSPK__GFFT_C2C; break;
  case DSPK_C128: type = DSPK__GFFT_Z2Z; break;
  case DSPK_F32: type = DSPK__GFFT_R2C; break;
  case DSPK_F64: type = DSPK__GFFT_D2Z; break;
  default:
    return dspk__gpurt_msg(ctx, DSPK_EDTYPE, "fft: dtype %s not supported",
                          dspk__dtype_name(X->dtype));
  }
  if (dev->own_kernels || !DRV->fft_name || !DRV->fft_name()) {
    rc = fft_own(dev, op, n, nout, batch, ctx);
    goto scale;
  }
  if ((rc = dspk__gpurt_fft_plan(dev, type, n, nout, batch, &h, ctx)))
    return rc;
  s = DRV->fft_exec(h, type, in, out, op->u.fft.inverse);
  if (s != 0)
    return dspk__gpurt_msg(ctx, DSPK_EDEVICE, "fft: %s exec failed: %d", DRV->fft_name(), s);
  rc = 0;
scale:
  if (rc == 0 && op->u.fft.inverse)
    return map_scale(dev, dspk__gpurt_ptr(Y), Y->dtype, dspk__tensor_numel(Y), 1.0 / (double)n, ctx);
  return rc;
}

/* ---- fir, map, reduce ---------------------------------------------------- */

/* fir's direct kernel (fir_fft.c chooses between it and the FFT path). */
int dspk__gpurt_fir_direct(struct dspk__dev *dev, struct dspk__op *op, struct dspk__opctx *ctx) {
  const struct dspk__tensor *X = &op->in[0], *H = &op->in[1], *Y = &op->out[0];
  dspk__gptr x = dspk__gpurt_ptr(X), h = dspk__gpurt_ptr(H), y = dspk__gpurt_ptr(Y);
  int64_t n = X->shape[X->rank - 1], total = dspk__tensor_numel(X);
  int k;
  dspk__gfunc fn;
  void *args[6] = {&x, &h, &y, &n, &k, &total};
  int rc;
  if (H->shape[0] > INT32_MAX)
    return dspk__gpurt_msg(ctx, DSPK_ELIMIT, "fir: H has more than 2^31-1 taps");
  k = (int)H->shape[0];
  if (total == 0)
    return 0;
  if ((rc = dspk__gpurt_kfunc(dev, DSPK__K_FIR, X->dtype, "dspk_fir", &fn, ctx)))
    return rc;
  {
    char cls[32];
    snprintf(cls, sizeof(cls), "k=2^%d", dspk__autotune_pow2((uint64_t)k));
    return dspk__gpurt_launch_tuned(dev, fn, total, args, "fir", cls, X->dtype, ctx);
  }
}

static int op_map(struct dspk__dev *dev, struct dspk__op *op, struct dspk__opctx *ctx) {
  static const char *const names[] = {
#define XX(e, name, n) "dspk_map_" name,
      DSPK_MAPFN_MAP(XX)
#undef XX
  };
  const struct dspk__tensor *A = &op->in[0], *O = &op->out[0];
  dspk__gptr a = dspk__gpurt_ptr(A), b = op->nin > 1 ? dspk__gpurt_ptr(&op->in[1]) : a;
  dspk__gptr o = dspk__gpurt_ptr(O);
  int64_t n = dspk__tensor_numel(A);
  double alpha = dspk__op_map_alpha(op); /* f32-rounded for f32 and c64 */
  void *args[5] = {&a, &b, &o, &n, &alpha};
  dspk__gfunc fn;
  int rc;
  if (n == 0)
    return 0;
  if ((rc = dspk__gpurt_kfunc(dev, DSPK__K_MAP, A->dtype, names[op->u.map.fn], &fn, ctx)))
    return rc;
  /* Tuning reruns the kernel, which is harmless only when the output does
   * not alias an input. */
  if (o != a && o != b)
    return dspk__gpurt_launch_tuned(dev, fn, n, args, "map", NULL, A->dtype, ctx);
  return dspk__gpurt_launch1d(dev, fn, n, args, ctx);
}

/* Reduces X (contiguous, shape/rank) over the axes in mask into out, with
 * the kernel and launch the autotune framework chose (tune.c). */
static int reduce_into(struct dspk__dev *dev, dspk_dtype dt, const int64_t *shape,
                       int rank, uint32_t mask, int fn_code, dspk__gptr x,
                       dspk__gptr out, struct dspk__opctx *ctx) {
  struct rdesc d;
  int64_t st[DSPK_MAX_RANK];
  void *args[4] = {&x, &out, &d, &fn_code};
  size_t esz = dspk__dtype_size(dt);
  int inner = rank > 0 && (mask & (1u << (rank - 1))) != 0, overlap;
  memset(&d, 0, sizeof(d));
  strides_of(shape, rank, st);
  d.nout = d.nred_total = 1;
  for (int i = 0; i < rank; i++) {
    if (mask & (1u << i)) {
      d.red_shape[d.nred] = shape[i];
      d.red_stride[d.nred++] = st[i];
      d.nred_total *= shape[i];
    } else {
      d.keep_shape[d.nkeep] = shape[i];
      d.keep_stride[d.nkeep++] = st[i];
      d.nout *= shape[i];
    }
  }
  if (d.nout == 0)
    return 0;
  /* Tuning runs the kernel several times: only when out is not also read. */
  overlap = out < x + (dspk__gptr)((size_t)(d.nout * d.nred_total) * esz) &&
            x < out + (dspk__gptr)((size_t)d.nout * esz);
  return dspk__gpurt_reduce_launch(dev, dt, d.nout, d.nred_total, inner, args, !overlap, ctx);
}

static int op_reduce(struct dspk__dev *dev, struct dspk__op *op, struct dspk__opctx *ctx) {
  const struct dspk__tensor *X = &op->in[0];
  uint32_t axes = op->u.reduce.axes;
  if (axes == 0)
    axes = X->rank ? (uint32_t)((1ull << X->rank) - 1) : 0;
  return reduce_into(dev, X->dtype, X->shape, X->rank, axes, (int)op->u.reduce.fn,
                     dspk__gpurt_ptr(X), dspk__gpurt_ptr(&op->out[0]), ctx);
}

/* ---- contract ------------------------------------------------------------ */

/* A contraction plan: A and B are first reduced over labels that appear
 * nowhere else (when any), permuted to [batch, M, K] and [batch, K, N]
 * (when not already so), multiplied by one strided-batched gemm into
 * [batch, M, N], which is permuted into the output's order (when needed).
 * The workspaces live as long as the plan and are retired with it. */
struct cplan {
  struct dspk__dev *dev;
  dspk_dtype dt;
  int64_t nb, M, N, K;
  /* reductions of A and B */
  int red[2];
  uint32_t red_mask[2];
  int64_t shape[2][DSPK_MAX_RANK];
  int rank[2];
  /* permutations of the (reduced) operands and of the product; an operand
   * already in b m k / b k m (A) or b k n / b n k (B) order is read in place
   * with a transposition flag, a product wanted as b n m is made as C^T */
  int perm[3];
  int trans[2], swap;
  struct pdesc pd[3];
  /* check: scan the multiplied operands for an infinity or a NaN, and if
   * one is there make the output again adding every product (sd; the
   * kernels' dspk_sdesc in kernels/reduce.cu) */
  int check;
  struct sdesc {
    int nout, nin;
    int64_t oshape[DSPK_MAX_RANK], oa[DSPK_MAX_RANK], ob[DSPK_MAX_RANK];
    int64_t ishape[2 * DSPK_MAX_RANK], ia[2 * DSPK_MAX_RANK], ib[2 * DSPK_MAX_RANK];
    int64_t n, ninner;
  } sd;
  struct dspk__pool_block *ws_red[2], *ws_perm[3], *ws_flag;
};

static void cplan_release(void *ud, void *p) {
  struct cplan *pl = p;
  (void)ud;
  for (int i = 0; i < 2; i++)
    dspk__pool_put(&pl->dev->pool, pl->ws_red[i]);
  for (int i = 0; i < 3; i++)
    dspk__pool_put(&pl->dev->pool, pl->ws_perm[i]);
  dspk__pool_put(&pl->dev->pool, pl->ws_flag);
  free(pl);
}

void dspk__gpurt_contract_plan_evict(void *ud, void *plan) {
  /* Never a stream synchronize: the workspaces go back to the pool once an
   * event behind their last use completes (or, with the benchmark switch,
   * after a synchronize, to measure what that costs). */
  dspk__gpurt_retire(ud, cplan_release, NULL, plan);
}

/* The element strides of a contraction's labels in A and B, for
 * dspk_sumprod: the output's labels in its order, then the summed ones. */
static void sumprod_desc(const struct dspk__tensor *const T[2], const struct dspk__tensor *O,
                         char lab[3][DSPK_MAX_RANK + 1], struct sdesc *d) {
  int64_t st[2][DSPK_MAX_RANK];
  char inner[2 * DSPK_MAX_RANK];
  int ni = 0;
  memset(d, 0, sizeof(*d));
  for (int t = 0; t < 2; t++)
    strides_of(T[t]->shape, T[t]->rank, st[t]);
  for (int t = 0; t < 2; t++)
    for (int i = 0; lab[t][i]; i++) {
      char c = lab[t][i];
      if (!strchr(lab[2], c) && !memchr(inner, c, (size_t)ni))
        inner[ni++] = c;
    }
  d->nout = O->rank;
  d->n = 1;
  for (int i = 0; i < O->rank; i++) {
    d->oshape[i] = O->shape[i];
    d->n *= O->shape[i];
  }
  d->nin = ni;
  d->ninner = 1;
  for (int t = 0; t < 2; t++)
    for (int i = 0; lab[t][i]; i++) {
      const char *at = strchr(lab[2], lab[t][i]);
      int64_t *sa = t ? d->ob : d->oa, *si = t ? d->ib : d->ia;
      if (at) {
        sa[at - lab[2]] += st[t][i];
      } else {
        int k = (int)((const char *)memchr(inner, lab[t][i], (size_t)ni) - inner);
        d->ishape[k] = T[t]->shape[i];
        si[k] += st[t][i];
      }
    }
  for (int k = 0; k < ni; k++)
    d->ninner *= d->ishape[k];
}

static int cplan_make(struct dspk__dev *dev, const struct dspk__op *op, struct cplan **out,
                      struct dspk__opctx *ctx) {
  const struct dspk__tensor *T[2] = {&op->in[0], &op->in[1]};
  const struct dspk__tensor *O = &op->out[0];
  char lab[3][DSPK_MAX_RANK + 1], msg[256];
  int64_t size[128];
  char bl[DSPK_MAX_RANK], ml[DSPK_MAX_RANK], nl[DSPK_MAX_RANK], kl[DSPK_MAX_RANK];
  int nbl = 0, nml = 0, nnl = 0, nkl = 0;
  char cur[2][DSPK_MAX_RANK + 1]; /* labels of the reduced operands */
  size_t esz = dspk__dtype_size(O->dtype);
  struct cplan *pl;
  int rc;
  if ((rc = dspk__contract_parse(op->u.contract.subscripts, T[0], T[1], lab, size, msg,
                                 sizeof(msg))))
    return dspk__gpurt_msg(ctx, rc, "%s", msg);
  pl = calloc(1, sizeof(*pl));
  if (!pl)
    return DSPK_ENOMEM;
  pl->dev = dev;
  pl->dt = O->dtype;
#define IN(t, c) (strchr(lab[t], (c)) != NULL)
  /* Classify labels: batch and M and N in output order, K in A's order. */
  for (int i = 0; lab[2][i]; i++) {
    char c = lab[2][i];
    if (IN(0, c) && IN(1, c)) bl[nbl++] = c;
    else if (IN(0, c)) ml[nml++] = c;
    else nl[nnl++] = c;
  }
  for (int i = 0; lab[0][i]; i++) {
    char c = lab[0][i];
    if (IN(1, c) && !IN(2, c)) kl[nkl++] = c;
  }
  /* Labels only in one operand and not in the output are summed first. */
  for (int t = 0; t < 2; t++) {
    int n = 0;
    pl->rank[t] = 0;
    for (int i = 0; lab[t][i]; i++) {
      char c = lab[t][i];
      if (!IN(1 - t, c) && !IN(2, c)) {
        pl->red[t] = 1;
        pl->red_mask[t] |= 1u << i;
      } else {
        cur[t][n++] = c;
        pl->shape[t][pl->rank[t]++] = T[t]->shape[i];
      }
    }
    cur[t][n] = 0;
  }
  pl->nb = pl->M = pl->N = pl->K = 1;
  for (int i = 0; i < nbl; i++) pl->nb *= size[(int)bl[i]];
  for (int i = 0; i < nml; i++) pl->M *= size[(int)ml[i]];
  for (int i = 0; i < nnl; i++) pl->N *= size[(int)nl[i]];
  for (int i = 0; i < nkl; i++) pl->K *= size[(int)kl[i]];
  /* Target orders: A' = b m k, B' = b k n, C' = b m n. */
  {
    char tgt[3][3 * DSPK_MAX_RANK + 1];
    const char *srcl[3] = {cur[0], cur[1], NULL};
    char cl[3 * DSPK_MAX_RANK + 1];
    int n;
    n = 0;
    memcpy(tgt[0] + n, bl, (size_t)nbl); n += nbl;
    memcpy(tgt[0] + n, ml, (size_t)nml); n += nml;
    memcpy(tgt[0] + n, kl, (size_t)nkl); n += nkl;
    tgt[0][n] = 0;
    n = 0;
    memcpy(tgt[1] + n, bl, (size_t)nbl); n += nbl;
    memcpy(tgt[1] + n, kl, (size_t)nkl); n += nkl;
    memcpy(tgt[1] + n, nl, (size_t)nnl); n += nnl;
    tgt[1][n] = 0;
    n = 0;
    memcpy(cl + n, bl, (size_t)nbl); n += nbl;
    memcpy(cl + n, ml, (size_t)nml); n += nml;
    memcpy(cl + n, nl, (size_t)nnl); n += nnl;
    cl[n] = 0;
    /* Operands: read in place when cur[t] is the target or its transposed
     * form, else gather from cur[t] into tgt[t]'s order. */
    for (int t = 0; t < 2; t++) {
      int64_t st[DSPK_MAX_RANK];
      struct pdesc *d = &pl->pd[t];
      char alt[3 * DSPK_MAX_RANK + 1];
      const char *g1 = t == 0 ? ml : kl, *g2 = t == 0 ? kl : nl;
      int n1 = t == 0 ? nml : nkl, n2 = t == 0 ? nkl : nnl;
      n = 0;
      memcpy(alt + n, bl, (size_t)nbl); n += nbl;
      memcpy(alt + n, g2, (size_t)n2); n += n2;
      memcpy(alt + n, g1, (size_t)n1); n += n1;
      alt[n] = 0;
      strides_of(pl->shape[t], pl->rank[t], st);
      pl->trans[t] = strcmp(srcl[t], tgt[t]) != 0 && strcmp(srcl[t], alt) == 0;
      pl->perm[t] = strcmp(srcl[t], tgt[t]) != 0 && !pl->trans[t];
      d->rank = (int)strlen(tgt[t]);
      for (int i = 0; i < d->rank; i++) {
        int at = (int)(strchr(srcl[t], tgt[t][i]) - srcl[t]);
        d->shape[i] = size[(int)tgt[t][i]];
        d->stride[i] = st[at];
      }
    }
    /* Product: scatter C' (order cl) into the output's order. */
    {
      int64_t cshape[3 * DSPK_MAX_RANK], st[3 * DSPK_MAX_RANK];
      struct pdesc *d = &pl->pd[2];
      int cr = (int)strlen(cl);
      char alt[3 * DSPK_MAX_RANK + 1];
      n = 0;
      memcpy(alt + n, bl, (size_t)nbl); n += nbl;
      memcpy(alt + n, nl, (size_t)nnl); n += nnl;
      memcpy(alt + n, ml, (size_t)nml); n += nml;
      alt[n] = 0;
      for (int i = 0; i < cr; i++)
        cshape[i] = size[(int)cl[i]];
      strides_of(cshape, cr, st);
      pl->swap = strcmp(cl, lab[2]) != 0 && strcmp(alt, lab[2]) == 0;
      pl->perm[2] = strcmp(cl, lab[2]) != 0 && !pl->swap;
      d->rank = O->rank;
      for (int i = 0; i < O->rank; i++) {
        int at = (int)(strchr(cl, lab[2][i]) - cl);
        d->shape[i] = O->shape[i];
        d->stride[i] = st[at];
      }
    }
  }
#undef IN
  /* Summing one operand's own labels first is exact only in real
   * arithmetic (backends/cpu/contract.c says why), and the vendor's complex
   * BLAS scales each sum by 1+0j, which turns inf+nanj into nan+nanj: such
   * contractions check their operands and, when one holds an infinity or a
   * NaN, make the output again as numpy's einsum does (dspk_sumprod). */
  pl->check = pl->red[0] || pl->red[1] ||
              (dspk__dtype_is_complex(pl->dt) && dev->blas && !dev->own_kernels &&
               !own_gemm_fits(dev, pl->dt, pl->M, pl->N, pl->K, pl->nb));
  if (pl->check)
    sumprod_desc(T, O, lab, &pl->sd);
  /* Workspaces. */
  for (int t = 0; t < 2; t++) {
    int64_t n = 1;
    for (int i = 0; i < pl->rank[t]; i++)
      n *= pl->shape[t][i];
    if (pl->red[t] && (rc = dspk__gpurt_tmp_alloc(dev, (size_t)n * esz, &pl->ws_red[t])))
      goto fail;
    if (pl->perm[t] && (rc = dspk__gpurt_tmp_alloc(dev, (size_t)n * esz, &pl->ws_perm[t])))
      goto fail;
  }
  if (pl->perm[2] &&
      (rc = dspk__gpurt_tmp_alloc(dev, (size_t)(pl->nb * pl->M * pl->N) * esz, &pl->ws_perm[2])))
    goto fail;
  if (pl->check && (rc = dspk__gpurt_tmp_alloc(dev, sizeof(unsigned), &pl->ws_flag)))
    goto fail;
  *out = pl;
  return 0;
fail:
  cplan_release(NULL, pl);
  return dspk__gpurt_msg(ctx, rc, "contract: no device memory for the workspaces");
}

static int contract_launch(struct dspk__dev *dev, struct cplan *pl,
                           const struct dspk__tensor *const T[2],
                           const struct dspk__tensor *O, dspk__gptr p[2],
                           struct dspk__opctx *ctx);

static int op_contract(struct dspk__dev *dev, struct dspk__op *op, struct dspk__opctx *ctx) {
  const struct dspk__tensor *T[2] = {&op->in[0], &op->in[1]};
  const struct dspk__tensor *O = &op->out[0];
  struct { char subs[DSPK__SUBSCRIPTS_MAX]; int dt, ra, rb; int64_t sa[DSPK_MAX_RANK], sb[DSPK_MAX_RANK]; } key;
  struct cplan *pl;
  dspk__gptr p[2];
  int rc;
  if (dspk__tensor_numel(O) == 0)
    return 0;
  if (dspk__tensor_numel(T[0]) == 0 || dspk__tensor_numel(T[1]) == 0) {
    /* Every sum is empty: zeros, before any plan sizes its workspaces by
     * labels that can still be large. */
    int r = DRV->memset_async(dspk__gpurt_ptr(O), 0, dspk__tensor_nbytes(O), dev->stream);
    return r ? dspk__gpurt_err(dev, ctx, "cuMemsetD8Async", r) : 0;
  }
  memset(&key, 0, sizeof(key));
  snprintf(key.subs, sizeof(key.subs), "%s", op->u.contract.subscripts);
  key.dt = (int)O->dtype;
  key.ra = T[0]->rank;
  key.rb = T[1]->rank;
  memcpy(key.sa, T[0]->shape, sizeof(key.sa));
  memcpy(key.sb, T[1]->shape, sizeof(key.sb));
  pl = dspk__plancache_get(&dev->contract_plans, &key, sizeof(key));
  if (!pl) {
    if ((rc = cplan_make(dev, op, &pl, ctx)))
      return rc;
    dspk__plancache_put(&dev->contract_plans, &key, sizeof(key), pl);
  }
  if (pl->K == 0) {
    int r = DRV->memset_async(dspk__gpurt_ptr(O), 0, dspk__tensor_nbytes(O), dev->stream);
    return r ? dspk__gpurt_err(dev, ctx, "cuMemsetD8Async", r) : 0;
  }
  if (dev->trace_start) {
    DRV->event_record(dev->trace_start, dev->stream);
    dev->trace_start = NULL;
  }
  rc = contract_launch(dev, pl, T, O, p, ctx);
  if (dev->trace_end) {
    DRV->event_record(dev->trace_end, dev->stream);
    dev->trace_end = NULL;
  }
  return rc;
}

/* The launches of one contraction with a ready plan. */
static int contract_launch(struct dspk__dev *dev, struct cplan *pl,
                           const struct dspk__tensor *const T[2],
                           const struct dspk__tensor *O, dspk__gptr p[2],
                           struct dspk__opctx *ctx) {
  dspk__gptr c, flag = pl->check ? (dspk__gptr)pl->ws_flag->handle : 0;
  size_t esz = dspk__dtype_size(O->dtype);
  int rc, r;
  if (pl->check && (r = DRV->memset_async(flag, 0, sizeof(unsigned), dev->stream)))
    return dspk__gpurt_err(dev, ctx, "cuMemsetD8Async", r);
  for (int t = 0; t < 2; t++) {
    p[t] = dspk__gpurt_ptr(T[t]);
    if (pl->red[t]) {
      dspk__gptr dst = (dspk__gptr)pl->ws_red[t]->handle;
      if ((rc = reduce_into(dev, pl->dt, T[t]->shape, T[t]->rank, pl->red_mask[t], 0, p[t],
                            dst, ctx)))
        return rc;
      p[t] = dst;
    }
    if (pl->perm[t]) {
      dspk__gptr dst = (dspk__gptr)pl->ws_perm[t]->handle;
      if ((rc = permute(dev, p[t], dst, esz, &pl->pd[t], ctx)))
        return rc;
      p[t] = dst;
    }
    if (pl->check) {
      dspk__gfunc fn;
      int64_t n = 1;
      void *args[3] = {&p[t], &n, &flag};
      for (int i = 0; i < pl->rank[t]; i++)
        n *= pl->shape[t][i];
      if ((rc = dspk__gpurt_kfunc(dev, DSPK__K_REDUCE, pl->dt, "dspk_nonfinite", &fn, ctx)) ||
          (rc = dspk__gpurt_launch1d(dev, fn, n, args, ctx)))
        return rc;
    }
  }
  c = pl->perm[2] ? (dspk__gptr)pl->ws_perm[2]->handle : dspk__gpurt_ptr(O);
  /* C^T (b n m) = op(B)^T op(A)^T: the operands swap and so do their flags. */
  rc = pl->swap ? gemm_rm(dev, pl->dt, !pl->trans[1], !pl->trans[0], pl->N, pl->M, pl->K, 1.0,
                          p[1], pl->K * pl->N, p[0], pl->M * pl->K, 0.0, c, pl->M * pl->N,
                          pl->nb, ctx)
                : gemm_rm(dev, pl->dt, pl->trans[0], pl->trans[1], pl->M, pl->N, pl->K, 1.0,
                          p[0], pl->M * pl->K, p[1], pl->K * pl->N, 0.0, c, pl->M * pl->N,
                          pl->nb, ctx);
  if (rc)
    return rc;
  if (pl->perm[2] && (rc = permute(dev, c, dspk__gpurt_ptr(O), esz, &pl->pd[2], ctx)))
    return rc;
  if (pl->check) {
    /* Every output again from the original operands when the scans found
     * an infinity or a NaN; the kernel reads the flag and otherwise does
     * nothing (no wait for the scans on the host). */
    dspk__gfunc fn;
    dspk__gptr a = dspk__gpurt_ptr(T[0]), b = dspk__gpurt_ptr(T[1]), o = dspk__gpurt_ptr(O);
    void *args[5] = {&a, &b, &o, &pl->sd, &flag};
    if ((rc = dspk__gpurt_kfunc(dev, DSPK__K_REDUCE, pl->dt, "dspk_sumprod", &fn, ctx)) ||
        (rc = dspk__gpurt_launch1d(dev, fn, pl->sd.n, args, ctx)))
      return rc;
  }
  return 0;
}

/* ---- raw kernels --------------------------------------------------------- */

/* A compiled raw kernel: loaded in the daemon's context only to check its
 * entry points (loading runs no code); the code object (cubin, hsaco) goes
 * to the worker. */
struct rawmod {
  dspk__gmodule mod;
  struct dspk__dev *dev;
  uint32_t gen;
  void *cubin;
  size_t cubin_len;
  char cache_id[DSPK__HASH_HEX]; /* its cache entry, "" when none (yet) */
};

static void rawmod_release(void *ud, void *p) {
  struct rawmod *m = p;
  (void)ud;
  if (m->gen == m->dev->gen && !m->dev->ctx_dead)
    m->dev->drv->module_unload(m->mod);
  free(m->cubin);
  free(m);
}

void dspk__gpurt_raw_module_evict(void *ud, void *mod) {
  dspk__gpurt_retire(ud, rawmod_release, NULL, mod);
}

static int op_kernel(struct dspk__dev *dev, struct dspk__op *op, struct dspk__opctx *ctx) {
  const char *lang = op->u.kernel.lang;
  struct dspk__hash h;
  struct { uint64_t hi, lo; } key;
  struct rawmod *m;
  dspk__gfunc fn;
  int r;
  int rc;
  if (!lang || strcmp(lang, DRV->lang) != 0)
    return dspk__gpurt_msg(ctx, DSPK_ENOTSUP,
                          "kernel: %s devices take lang \"%s\" (%s), not \"%s\"",
                          DRV->name, DRV->lang, DRV->lang_desc, lang ? lang : "");
  for (int i = 0; i < 3; i++)
    if (op->u.kernel.grid[i] == 0 || op->u.kernel.block[i] == 0)
      return dspk__gpurt_msg(ctx, DSPK_EINVAL, "kernel: grid and block sizes must be >= 1");
  /* A client's module is its owner's alone (op.h, owner): in the table and
   * in the persistent cache, so a hit tells no one about another uid. */
  dspk__hash_init(&h);
  dspk__hash_field(&h, op->u.kernel.source, op->u.kernel.source_len);
  dspk__hash_str(&h, "owner");
  dspk__hash_u64(&h, ctx ? ctx->owner : 0);
  key.hi = h.hi;
  key.lo = h.lo;
  m = dspk__plancache_get(&dev->raw_modules, &key, sizeof(key));
  if (m) {
    dspk__cache_kernel_used(dev->env.cache, m->cache_id); /* served from memory */
  } else {
    char cache_id[DSPK__HASH_HEX];
    char *log = ctx && ctx->errmsg ? ctx->errmsg : NULL;
    size_t loglen = ctx && ctx->errmsg ? ctx->errmsg_len : 0;
    void *bin = NULL;
    size_t blen = 0;
    struct dspk__opctx anon = {0};
    if ((rc = dspk__gpurt_compile_client(DRV, dev, NULL, "kernel.cu", ctx ? ctx : &anon,
                                        op->u.kernel.source,
                                       op->u.kernel.source_len, &bin, &blen, log, loglen,
                                       cache_id)))
      return rc;
    m = calloc(1, sizeof(*m));
    if (!m) {
      free(bin);
      return DSPK_ENOMEM;
    }
    m->dev = dev;
    m->gen = dev->gen;
    r = DRV->module_load(&m->mod, bin);
    if (r != 0) {
      free(bin);
      free(m);
      return dspk__gpurt_err(dev, ctx, "kernel: cuModuleLoadData", r);
    }
    m->cubin = bin;
    m->cubin_len = blen;
    memcpy(m->cache_id, cache_id, sizeof cache_id);
    dspk__plancache_put(&dev->raw_modules, &key, sizeof(key), m);
  }
  r = DRV->module_func(&fn, m->mod, op->u.kernel.entry);
  if (DRV->classify(r) == DSPK__G_NOT_FOUND) {
    char echo[DSPK__ECHO_CAP(DSPK__ENTRY_MAX)];
    return dspk__gpurt_msg(ctx, DSPK_EINVAL,
                          "kernel: no entry \"%s\" in the source (declare it extern \"C\" "
                          "__global__)",
                          dspk__utf8_echo(echo, sizeof echo, op->u.kernel.entry,
                                          strlen(op->u.kernel.entry), DSPK__ENTRY_MAX));
  }
  if (r != 0)
    return dspk__gpurt_err(dev, ctx, "kernel: cuModuleGetFunction", r);
  /* Loaded, its entry found: into the persistent cache (not a hit from it:
   * those have their id already). */
  if (!m->cache_id[0])
    dspk__gpurt_store_client(dev, "kernel.cu", ctx ? ctx : &(struct dspk__opctx){0},
                             op->u.kernel.source, op->u.kernel.source_len, m->cubin,
                             m->cubin_len, m->cache_id);
  /* Client code runs in the worker process: a fault there cannot poison
   * this process's runtime (sticky errors are per process). */
  return dspk__gpurt_worker_run(dev, op, m->cubin, m->cubin_len, ctx);
}

int dspk__gpurt_run(struct dspk__dev *dev, struct dspk__op *op, struct dspk__opctx *ctx) {
  switch (op->kind) {
  case DSPK_OP_GEMM: return op_gemm(dev, op, ctx);
  case DSPK_OP_FFT: return op_fft(dev, op, ctx);
  case DSPK_OP_FIR: return dspk__gpurt_fir(dev, op, ctx);
  case DSPK_OP_CONTRACT: return op_contract(dev, op, ctx);
  case DSPK_OP_REDUCE: return op_reduce(dev, op, ctx);
  case DSPK_OP_MAP: return op_map(dev, op, ctx);
  case DSPK_OP_KERNEL: return op_kernel(dev, op, ctx);
  default:
    return dspk__gpurt_msg(ctx, DSPK_ENOTSUP, "op %d is not supported on %s", (int)op->kind,
                           DRV->name);
  }
}
