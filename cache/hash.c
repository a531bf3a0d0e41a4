/*
 * The key hash of the cache: 128-bit FNV-1a over length-prefixed fields.
 *
 * SQLite offers no hash function and keys must not depend on an external
 * library's version, so this small, fixed function is part of the on-disk
 * format: changing it invalidates every stored key (bump the schema version
 * in cache.c if it ever changes).  FNV-1a is not collision resistant against
 * an adversary, which is acceptable here: only the daemon writes the cache,
 * and a hit additionally compares the stored key fields.
 */
#include <string.h>

#include "cache/cache.h"

/* FNV-1a 128: offset basis 0x6c62272e07bb014262b821756295c58d,
 * prime 2^88 + 0x13b. */
#define FNV128_BASIS_HI UINT64_C(0x6c62272e07bb0142)
#define FNV128_BASIS_LO UINT64_C(0x62b821756295c58d)
#define FNV128_PRIME_LO UINT64_C(0x13b)

static void mul_prime(struct dspk__hash *h) {
  /* (hi, lo) * (2^88 + 0x13b) mod 2^128, in 64-bit pieces. */
  uint64_t a = h->lo & UINT64_C(0xffffffff), b = h->lo >> 32;
  uint64_t ap = a * FNV128_PRIME_LO, bp = b * FNV128_PRIME_LO;
  uint64_t lo = ap + (bp << 32);
  uint64_t carry = lo < ap;
  uint64_t hi = h->hi * FNV128_PRIME_LO + (bp >> 32) + carry + (h->lo << 24);
  h->hi = hi;
  h->lo = lo;
}

static void feed(struct dspk__hash *h, const unsigned char *p, size_t n) {
  for (size_t i = 0; i < n; i++) {
    h->lo ^= p[i];
    mul_prime(h);
  }
}

/* Initialises h to the FNV-1a 128 offset basis. */
void dspk__hash_init(struct dspk__hash *h) {
  h->hi = FNV128_BASIS_HI;
  h->lo = FNV128_BASIS_LO;
}

/* Feeds n as 8 little-endian bytes, then the n bytes at p. */
void dspk__hash_field(struct dspk__hash *h, const void *p, size_t n) {
  unsigned char len[8];
  uint64_t v = n;
  for (int i = 0; i < 8; i++)
    len[i] = (unsigned char)(v >> (8 * i));
  feed(h, len, sizeof len);
  if (n)
    feed(h, p, n);
}

/* Feeds a string field; NULL is a length of 2^64-1 with no bytes, which no
 * real string can produce. */
void dspk__hash_str(struct dspk__hash *h, const char *s) {
  if (!s) {
    static const unsigned char null_marker[8] = {0xff, 0xff, 0xff, 0xff,
                                                 0xff, 0xff, 0xff, 0xff};
    feed(h, null_marker, sizeof null_marker);
    return;
  }
  dspk__hash_field(h, s, strlen(s));
}

/* Feeds v as one 8-byte field. */
void dspk__hash_u64(struct dspk__hash *h, uint64_t v) {
  unsigned char b[8];
  for (int i = 0; i < 8; i++)
    b[i] = (unsigned char)(v >> (8 * i));
  dspk__hash_field(h, b, sizeof b);
}

/* Writes the hash as 32 lowercase hex digits, high word first. */
void dspk__hash_hex(const struct dspk__hash *h, char hex[DSPK__HASH_HEX]) {
  static const char digits[] = "0123456789abcdef";
  for (int i = 0; i < 16; i++) {
    hex[i] = digits[(h->hi >> (60 - 4 * i)) & 0xf];
    hex[16 + i] = digits[(h->lo >> (60 - 4 * i)) & 0xf];
  }
  hex[32] = '\0';
}

/* Returns hi ^ lo of the hash of one field holding p[0..n). */
uint64_t dspk__hash64(const void *p, size_t n) {
  struct dspk__hash h;
  dspk__hash_init(&h);
  dspk__hash_field(&h, p, n);
  return h.hi ^ h.lo;
}
