/*
 * consumer: connects to a dspkd (socket path in argv[1]) through the
 * installed libdspkclient, runs a 2x3 @ 3x2 gemm on cpu:0 and checks the
 * product against one computed here.  Without an argument it only prints
 * the library's version.  Exit 0 and "consumer ok" on success.
 */
#include <dspk/dspk.h>
#include <math.h>
#include <stdio.h>

int main(int argc, char **argv) {
  printf("libdspkclient %s\n", dspk_version());
  if (argc < 2) {
    printf("consumer ok\n");
    return 0;
  }
  static const double a[6] = {1, 2, 3, 4, 5, 6};       /* 2x3 */
  static const double b[6] = {7, 8, 9, 10, 11, 12};    /* 3x2 */
  const int64_t sa[2] = {2, 3}, sb[2] = {3, 2};
  dspk_client *c = NULL;
  int rc = dspk_connect(argv[1], "consumer", &c);
  if (rc != 0) {
    fprintf(stderr, "consumer: connect: %s: %s\n", dspk_err_name(rc), dspk_connect_error());
    return 1;
  }
  dspk_tensor in[2];
  dspk_tensor_inline(&in[0], DSPK_F64, 2, sa, a);
  dspk_tensor_inline(&in[1], DSPK_F64, 2, sb, b);
  dspk_task t;
  dspk_task_init(&t, DSPK_OP_GEMM);
  t.device = "cpu:0";
  t.ninputs = 2;
  t.inputs = in;
  dspk_result r = {0};
  rc = dspk_run(c, &t, &r);
  if (rc != 0) {
    fprintf(stderr, "consumer: gemm: %s: %s\n", dspk_err_name(rc), dspk_last_error(c));
    dspk_close(c);
    return 1;
  }
  int bad = r.nout != 1 || r.out[0].rank != 2 || r.out[0].shape[0] != 2 ||
            r.out[0].shape[1] != 2 || r.out[0].dtype != DSPK_F64;
  for (int i = 0; !bad && i < 2; i++)
    for (int j = 0; j < 2; j++) {
      double want = 0;
      for (int k = 0; k < 3; k++)
        want += a[i * 3 + k] * b[k * 2 + j];
      double got = ((const double *)r.out[0].data)[i * 2 + j];
      if (fabs(got - want) > 1e-9) {
        fprintf(stderr, "consumer: C[%d][%d] = %g, want %g\n", i, j, got, want);
        bad = 1;
      }
    }
  printf("gemm on %s: %s\n", r.device, bad ? "WRONG" : "right");
  dspk_result_free(&r);
  dspk_close(c);
  if (bad)
    return 1;
  printf("consumer ok\n");
  return 0;
}
