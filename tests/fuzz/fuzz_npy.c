/*
 * dspk-submit's .npy reader (client/submit/npy.c): the whole input as a
 * file image for dspk__npy_load_mem, and as the dict text for
 * dspk__npy_parse_header.  Oracles: a loaded array has count = product of
 * its shape and nbytes = count * itemsize; the header dspk__npy_header_build
 * writes for it parses back to the same dtype and shape, and that header
 * followed by the data loads to the same bytes.
 */
#include <string.h>

#include "client/submit/npy.h"
#include "dspk/errors.h"
#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  dspk__npy a = {0}, b = {0};
  dspk__npy_header h;
  char err[256];
  unsigned char *hdr = NULL, *img = NULL;
  size_t hlen = 0;
  uint64_t count = 1;

  (void)dspk__npy_parse_header((const char *)data, size, &h, err, sizeof err);
  if (dspk__npy_load_mem(data, size, "<fuzz>", &a, err, sizeof err) != 0) {
    FUZZ_CHECK(strlen(err) < sizeof err);
    return 0;
  }
  FUZZ_CHECK(a.rank >= 0 && a.rank <= DSPK_MAX_RANK);
  for (int i = 0; i < a.rank; i++)
    count *= a.shape[i];
  FUZZ_CHECK(count == a.count);
  FUZZ_CHECK(a.nbytes == a.count * dspk__npy_itemsize(a.dtype));

  FUZZ_CHECK(dspk__npy_header_build(a.dtype, a.rank, a.shape, &hdr, &hlen) == 0);
  img = malloc(hlen + a.nbytes + 1);
  FUZZ_CHECK(img);
  memcpy(img, hdr, hlen);
  if (a.nbytes)
    memcpy(img + hlen, a.data, a.nbytes);
  FUZZ_CHECK(dspk__npy_load_mem(img, hlen + a.nbytes, "<rebuilt>", &b, err, sizeof err) == 0);
  FUZZ_CHECK(b.dtype == a.dtype && b.rank == a.rank && b.count == a.count &&
             b.nbytes == a.nbytes);
  FUZZ_CHECK(memcmp(b.shape, a.shape, (size_t)a.rank * sizeof a.shape[0]) == 0);
  FUZZ_CHECK(a.nbytes == 0 || memcmp(b.data, a.data, a.nbytes) == 0);
  free(img);
  free(hdr);
  dspk__npy_free(&b);
  dspk__npy_free(&a);
  return 0;
}
