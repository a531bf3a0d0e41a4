/*
 * Unit tests of cache/: the key hash against independently computed FNV-1a
 * 128 vectors; that every component of a kernel or autotune key turns a
 * change into a miss; persistence across close/reopen; blobs; LRU eviction
 * under the size bound; clearing by kind; corruption recovery (a broken
 * header and a broken page); the in-memory fallback for an unusable
 * location; a schema newer than the build; another program's database
 * left alone byte for byte; an empty file made a cache; a cache made before
 * caches were marked still used; a damaged schema moved aside with a
 * message that says what is wrong; the file deleted or replaced while
 * open; the default XDG location; two processes and several threads
 * writing one file at once.
 *
 * Each test works in its own fresh directory under $TMPDIR.
 */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <time.h>
#include <pthread.h>
#include <pwd.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <sqlite3.h>

#include "cache/cache.h"

struct fixture {
  char dir[256];
  char db[300];
};

static int rm_rf_cb(const char *dir) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  return system(cmd);
}

static int setup(void **state) {
  struct fixture *f = calloc(1, sizeof *f);
  const char *tmp = getenv("TMPDIR");
  snprintf(f->dir, sizeof f->dir, "%s/dspk-cache-test-XXXXXX",
           tmp && tmp[0] ? tmp : "/tmp");
  if (!mkdtemp(f->dir))
    return -1;
  snprintf(f->db, sizeof f->db, "%s/sub/dir/cache.db", f->dir);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  struct fixture *f = *state;
  rm_rf_cb(f->dir);
  free(f);
  return 0;
}

static struct dspk__cache *open_ok(const char *path,
                                   const struct dspk__cache_opts *o) {
  struct dspk__cache *c = NULL;
  char warn[512] = "x";
  assert_int_equal(dspk__cache_open(path, o, &c, warn, sizeof warn), 0);
  assert_string_equal(warn, "");
  assert_non_null(c);
  return c;
}

/* A kernel key whose fields point at string literals. */
static struct dspk__kernel_key base_kernel(void) {
  static const char src[] = "__global__ void k(float *x) { x[0] = 1; }";
  struct dspk__kernel_key k = {
      .dev = {"cuda", "NVIDIA H200", "sm_90", "GPU-1234", "550.54.15"},
      .compiler = "nvrtc",
      .compiler_version = "12.4.131",
      .name = "k",
      .source = src,
      .source_len = sizeof src - 1,
      .options = "-arch=sm_90 -O3",
  };
  return k;
}

static struct dspk__tune_key base_tune(void) {
  struct dspk__tune_key k = {
      .dev = {"cpu", "AMD EPYC", "x86_64", "", "fftw-3.3.10"},
      .op = "fir",
      .shape = "n=2^16,k=2^6",
      .dtypes = "f32",
      .layout = "",
      .cands_hash = 0x1234,
  };
  return k;
}

static void test_hash_vectors(void **state) {
  (void)state;
  struct dspk__hash h;
  char hex[DSPK__HASH_HEX];
  /* Expected values computed independently (Python big integers). */
  dspk__hash_init(&h);
  dspk__hash_hex(&h, hex);
  assert_string_equal(hex, "6c62272e07bb014262b821756295c58d");
  dspk__hash_init(&h);
  dspk__hash_field(&h, "a", 1);
  dspk__hash_hex(&h, hex);
  assert_string_equal(hex, "426d56754e03ad9adb79f299c730f21f");
  dspk__hash_init(&h);
  dspk__hash_str(&h, "ab");
  dspk__hash_str(&h, "c");
  dspk__hash_hex(&h, hex);
  assert_string_equal(hex, "b6ce7db35a06e7457857fa227a8bde4e");
  dspk__hash_init(&h);
  dspk__hash_str(&h, NULL);
  dspk__hash_hex(&h, hex);
  assert_string_equal(hex, "1f1206bf386598cfecc541ed53713e45");
  /* Field boundaries matter. */
  struct dspk__hash h2;
  dspk__hash_init(&h2);
  dspk__hash_str(&h2, "a");
  dspk__hash_str(&h2, "bc");
  dspk__hash_init(&h);
  dspk__hash_str(&h, "ab");
  dspk__hash_str(&h, "c");
  assert_false(h.hi == h2.hi && h.lo == h2.lo);
  /* "" differs from NULL. */
  dspk__hash_init(&h);
  dspk__hash_str(&h, "");
  dspk__hash_init(&h2);
  dspk__hash_str(&h2, NULL);
  assert_false(h.hi == h2.hi && h.lo == h2.lo);
}

static void expect_kernel(struct dspk__cache *c,
                          const struct dspk__kernel_key *k, const char *want) {
  void *bin = NULL;
  size_t len = 0;
  int rc = dspk__cache_kernel_get(c, k, &bin, &len);
  if (!want) {
    assert_int_equal(rc, DSPK_ENOENT);
    assert_null(bin);
    return;
  }
  assert_int_equal(rc, 0);
  assert_int_equal(len, strlen(want));
  assert_memory_equal(bin, want, len);
  free(bin);
}

/* One test per key component: each change must be a miss. */
enum kfield { KF_SOURCE, KF_OPTIONS, KF_COMPILER_VERSION, KF_COMPILER,
              KF_DEVICE_NAME, KF_UUID, KF_ARCH, KF_DRIVER, KF_BACKEND,
              KF_NAME, KF_OWNER, KF_OTHER_OWNER };

static void kernel_component_miss(void **state, enum kfield field) {
  struct fixture *f = *state;
  struct dspk__cache *c = open_ok(f->db, NULL);
  struct dspk__kernel_key k = base_kernel();
  if (field == KF_OTHER_OWNER)
    k.owner = "uid 1001";
  assert_int_equal(dspk__cache_kernel_put(c, &k, "BINARY", 6), 0);
  expect_kernel(c, &k, "BINARY");

  struct dspk__kernel_key m = k;
  static const char src2[] = "__global__ void k(float *x) { x[0] = 2; }";
  switch (field) {
  case KF_SOURCE:
    m.source = src2;
    m.source_len = sizeof src2 - 1;
    break;
  case KF_OPTIONS: m.options = "-arch=sm_90 -O2"; break;
  case KF_COMPILER_VERSION: m.compiler_version = "12.4.132"; break;
  case KF_COMPILER: m.compiler = "nvcc"; break;
  case KF_DEVICE_NAME: m.dev.name = "NVIDIA H100"; break;
  case KF_UUID: m.dev.uuid = "GPU-5678"; break;
  case KF_ARCH: m.dev.arch = "sm_89"; break;
  case KF_DRIVER: m.dev.driver = "550.54.16"; break;
  case KF_BACKEND: m.dev.backend = "hip"; break;
  case KF_NAME: m.name = NULL; break;
  /* A client's kernel is its owner's alone (docs/cache.md, Keys). */
  case KF_OWNER: m.owner = "uid 1001"; break;
  case KF_OTHER_OWNER: m.owner = "uid 1002"; break;
  }
  expect_kernel(c, &m, NULL);
  /* The changed key stores its own entry; the old one is untouched. */
  assert_int_equal(dspk__cache_kernel_put(c, &m, "OTHER", 5), 0);
  expect_kernel(c, &m, "OTHER");
  expect_kernel(c, &k, "BINARY");

  struct dspk__cache_stats s;
  assert_int_equal(dspk__cache_stats(c, &s), 0);
  assert_int_equal(s.kind[DSPK__CACHE_KERNELS].entries, 2);
  assert_int_equal(s.kind[DSPK__CACHE_KERNELS].hits, 3);
  assert_int_equal(s.kind[DSPK__CACHE_KERNELS].misses, 1);
  assert_int_equal(s.kind[DSPK__CACHE_KERNELS].stored_hits, 3);
  dspk__cache_close(c);
}

static void test_kernel_miss_source(void **s) { kernel_component_miss(s, KF_SOURCE); }
static void test_kernel_miss_options(void **s) { kernel_component_miss(s, KF_OPTIONS); }
static void test_kernel_miss_compiler_version(void **s) { kernel_component_miss(s, KF_COMPILER_VERSION); }
static void test_kernel_miss_compiler(void **s) { kernel_component_miss(s, KF_COMPILER); }
static void test_kernel_miss_device(void **s) { kernel_component_miss(s, KF_DEVICE_NAME); }
static void test_kernel_miss_uuid(void **s) { kernel_component_miss(s, KF_UUID); }
static void test_kernel_miss_arch(void **s) { kernel_component_miss(s, KF_ARCH); }
static void test_kernel_miss_driver(void **s) { kernel_component_miss(s, KF_DRIVER); }
static void test_kernel_miss_backend(void **s) { kernel_component_miss(s, KF_BACKEND); }
static void test_kernel_miss_name(void **s) { kernel_component_miss(s, KF_NAME); }
static void test_kernel_miss_owner(void **s) { kernel_component_miss(s, KF_OWNER); }
static void test_kernel_miss_other_owner(void **s) { kernel_component_miss(s, KF_OTHER_OWNER); }

static void test_tune_components(void **state) {
  struct fixture *f = *state;
  struct dspk__cache *c = open_ok(f->db, NULL);
  struct dspk__tune_key k = base_tune();
  char w[32];
  assert_int_equal(dspk__cache_tune_get(c, &k, w, sizeof w), DSPK_ENOENT);
  assert_int_equal(dspk__cache_tune_put(c, &k, "fft", "{\"direct\":[9,9],\"fft\":[3,4]}"), 0);
  assert_int_equal(dspk__cache_tune_get(c, &k, w, sizeof w), 0);
  assert_string_equal(w, "fft");
  char t[128];
  assert_int_equal(dspk__cache_tune_timings(c, &k, t, sizeof t), 0);
  assert_string_equal(t, "{\"direct\":[9,9],\"fft\":[3,4]}");
  char tiny[3];
  assert_int_equal(dspk__cache_tune_get(c, &k, tiny, sizeof tiny), DSPK_ERANGE);

  for (int i = 0; i < 8; i++) {
    struct dspk__tune_key m = k;
    switch (i) {
    case 0: m.op = "gemm"; break;
    case 1: m.shape = "n=2^17,k=2^6"; break;
    case 2: m.dtypes = "f64"; break;
    case 3: m.layout = "unaligned"; break;
    case 4: m.cands_hash = 0x1235; break;
    case 5: m.dev.driver = "fftw-3.3.11"; break;
    case 6: m.dev.name = "Intel Xeon"; break;
    case 7: m.dev.uuid = NULL; break;
    }
    assert_int_equal(dspk__cache_tune_get(c, &m, w, sizeof w), DSPK_ENOENT);
  }
  /* Re-tune: delete, then a miss, then a new winner. */
  assert_int_equal(dspk__cache_tune_del(c, &k), 0);
  assert_int_equal(dspk__cache_tune_get(c, &k, w, sizeof w), DSPK_ENOENT);
  assert_int_equal(dspk__cache_tune_put(c, &k, "direct", NULL), 0);
  assert_int_equal(dspk__cache_tune_get(c, &k, w, sizeof w), 0);
  assert_string_equal(w, "direct");
  dspk__cache_close(c);
}

static void test_persistence(void **state) {
  struct fixture *f = *state;
  struct dspk__cache *c = open_ok(f->db, NULL);
  struct dspk__kernel_key k = base_kernel();
  struct dspk__tune_key t = base_tune();
  assert_int_equal(dspk__cache_kernel_put(c, &k, "BIN\0ARY", 7), 0);
  assert_int_equal(dspk__cache_tune_put(c, &t, "direct", "{}"), 0);
  assert_int_equal(dspk__cache_blob_put(c, "wisdom", "W1", 2), 0);
  assert_int_equal(dspk__cache_blob_put(c, "wisdom", "W22", 3), 0); /* replace */
  assert_false(dspk__cache_in_memory(c));
  assert_string_equal(dspk__cache_path(c), f->db);
  dspk__cache_close(c);

  c = open_ok(f->db, NULL);
  void *bin = NULL;
  size_t len = 0;
  assert_int_equal(dspk__cache_kernel_get(c, &k, &bin, &len), 0);
  assert_int_equal(len, 7);
  assert_memory_equal(bin, "BIN\0ARY", 7);
  free(bin);
  char w[16];
  assert_int_equal(dspk__cache_tune_get(c, &t, w, sizeof w), 0);
  assert_string_equal(w, "direct");
  assert_int_equal(dspk__cache_blob_get(c, "wisdom", &bin, &len), 0);
  assert_int_equal(len, 3);
  assert_memory_equal(bin, "W22", 3);
  free(bin);
  assert_int_equal(dspk__cache_blob_get(c, "nothing", &bin, &len), DSPK_ENOENT);
  struct dspk__cache_stats s;
  assert_int_equal(dspk__cache_stats(c, &s), 0);
  for (int i = 0; i < DSPK__CACHE_NKINDS; i++) {
    assert_int_equal(s.kind[i].entries, 1);
    assert_int_equal(s.kind[i].hits, 1);
    assert_true(s.kind[i].bytes > 0);
  }
  assert_int_equal(s.kind[DSPK__CACHE_BLOBS].misses, 1);
  {
    /* file_bytes counts the write-ahead log too (where the new entries are
     * until a checkpoint): the sizes of both files */
    struct stat sb, sw;
    char wal[512];
    snprintf(wal, sizeof wal, "%s-wal", f->db);
    assert_int_equal(stat(f->db, &sb), 0);
    if (stat(wal, &sw) != 0)
      sw.st_size = 0;
    assert_true(sw.st_size > 0);
    assert_int_equal(s.file_bytes, (uint64_t)(sb.st_size + sw.st_size));
  }
  assert_int_equal(dspk__cache_check(c), 0);
  dspk__cache_close(c);
  {
    /* Opened through a symbolic link, SQLite keeps the log beside the
     * link's target: file_bytes counts it there (it counted the target
     * alone, looking for the log beside the link). */
    char link[512], wal[512];
    struct stat sb, sw;
    snprintf(link, sizeof link, "%s.link", f->db);
    assert_int_equal(symlink(f->db, link), 0);
    c = open_ok(link, NULL);
    assert_int_equal(dspk__cache_blob_put(c, "viaLink", "L", 1), 0);
    assert_int_equal(dspk__cache_stats(c, &s), 0);
    snprintf(wal, sizeof wal, "%s-wal", f->db);
    assert_int_equal(stat(f->db, &sb), 0);
    assert_int_equal(stat(wal, &sw), 0);
    assert_true(sw.st_size > 0);
    assert_int_equal(s.file_bytes, (uint64_t)(sb.st_size + sw.st_size));
    dspk__cache_close(c);
    assert_int_equal(unlink(link), 0);
  }

  /* The file is really in WAL mode. */
  sqlite3 *db;
  assert_int_equal(sqlite3_open(f->db, &db), SQLITE_OK);
  sqlite3_stmt *st;
  assert_int_equal(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &st, NULL), SQLITE_OK);
  assert_int_equal(sqlite3_step(st), SQLITE_ROW);
  assert_string_equal((const char *)sqlite3_column_text(st, 0), "wal");
  sqlite3_finalize(st);
  sqlite3_close(db);
}

static void test_lru_eviction(void **state) {
  struct fixture *f = *state;
  struct dspk__cache_opts o = {.max_bytes = 10000};
  struct dspk__cache *c = open_ok(f->db, &o);
  char data[3000];
  memset(data, 'x', sizeof data);
  /* Three blobs of ~3000 bytes fit; a fourth does not. */
  assert_int_equal(dspk__cache_blob_put(c, "a", data, sizeof data), 0);
  assert_int_equal(dspk__cache_blob_put(c, "b", data, sizeof data), 0);
  assert_int_equal(dspk__cache_blob_put(c, "c", data, sizeof data), 0);
  void *p;
  size_t n;
  /* Touch a: b becomes the least recently used. */
  assert_int_equal(dspk__cache_blob_get(c, "a", &p, &n), 0);
  free(p);
  assert_int_equal(dspk__cache_blob_put(c, "d", data, sizeof data), 0);
  assert_int_equal(dspk__cache_blob_get(c, "b", &p, &n), DSPK_ENOENT);
  const char *keep[] = {"a", "c", "d"};
  for (int i = 0; i < 3; i++) {
    assert_int_equal(dspk__cache_blob_get(c, keep[i], &p, &n), 0);
    free(p);
  }
  /* Kinds share one bound and one recency order: a kernel entry pushes
   * out the least recent blob (a was touched before c and d). */
  struct dspk__kernel_key k = base_kernel();
  assert_int_equal(dspk__cache_kernel_put(c, &k, data, 2000), 0);
  assert_int_equal(dspk__cache_blob_get(c, "a", &p, &n), DSPK_ENOENT);
  struct dspk__cache_stats s;
  assert_int_equal(dspk__cache_stats(c, &s), 0);
  assert_int_equal(s.kind[DSPK__CACHE_BLOBS].evictions, 2);
  assert_true(s.kind[0].bytes + s.kind[1].bytes + s.kind[2].bytes <= 10000);
  /* An entry larger than the bound is refused. */
  static char big[20000];
  assert_int_equal(dspk__cache_blob_put(c, "big", big, sizeof big), DSPK_ELIMIT);
  dspk__cache_close(c);
}

static int sql_int(const char *path, const char *sql);

/* Each client's kernels hold at most a quarter of max_bytes, and a client's
 * put evicts only clients' kernels: one user compiling many kernels evicts
 * its own oldest, never another user's within its share, nor what the
 * daemon stored for itself (its kernels, decisions, blobs). */
static void test_owner_share(void **state) {
  struct fixture *f = *state;
  struct dspk__cache_opts o = {.max_bytes = 40000};
  struct dspk__cache *c = open_ok(f->db, &o);
  static char data[3000];
  char src[64];
  void *p;
  size_t n;
  memset(data, 'x', sizeof data);
  struct dspk__kernel_key mine = base_kernel(), other = base_kernel();
  mine.owner = "uid 1000";
  other.owner = "uid 1001";
  assert_int_equal(dspk__cache_blob_put(c, "wisdom", data, sizeof data), 0);
  struct dspk__kernel_key own = base_kernel(); /* the daemon's */
  assert_int_equal(dspk__cache_kernel_put(c, &own, data, sizeof data), 0);
  snprintf(src, sizeof src, "other");
  other.source = src;
  other.source_len = strlen(src);
  assert_int_equal(dspk__cache_kernel_put(c, &other, data, sizeof data), 0);
  /* 40 kernels of ~3 KB from uid 1000: 120 KB, three times the bound. */
  char srcs[40][16];
  for (int i = 0; i < 40; i++) {
    snprintf(srcs[i], sizeof srcs[i], "k%d", i);
    mine.source = srcs[i];
    mine.source_len = strlen(srcs[i]);
    assert_int_equal(dspk__cache_kernel_put(c, &mine, data, sizeof data), 0);
  }
  assert_int_equal(sql_int(f->db, "SELECT total(size) <= 10000 FROM kernels"
                                  " WHERE owner = 'uid 1000'"), 1);
  assert_int_equal(sql_int(f->db, "SELECT count(*) FROM kernels WHERE owner = 'uid 1000'"), 3);
  /* Its newest are kept, the others' entries all stay. */
  mine.source = srcs[39];
  mine.source_len = strlen(srcs[39]);
  assert_int_equal(dspk__cache_kernel_get(c, &mine, &p, &n), 0);
  free(p);
  assert_int_equal(dspk__cache_kernel_get(c, &other, &p, &n), 0);
  free(p);
  assert_int_equal(dspk__cache_kernel_get(c, &own, &p, &n), 0);
  free(p);
  assert_int_equal(dspk__cache_blob_get(c, "wisdom", &p, &n), 0);
  free(p);
  /* A client's entry larger than its share is refused. */
  static char big[12000];
  mine.source = "big";
  mine.source_len = 3;
  assert_int_equal(dspk__cache_kernel_put(c, &mine, big, sizeof big), DSPK_ELIMIT);
  dspk__cache_close(c);
}

/* A decision served from the autotune framework's in-process memo counts as
 * used (dspk__cache_tune_used): without a write per use, but before the next
 * put evicts, so the most used decision is not the first to go, and
 * stored_hits counts its uses. */
static void test_memo_uses_count(void **state) {
  struct fixture *f = *state;
  struct dspk__cache_opts o = {.max_bytes = 10000};
  struct dspk__cache *c = open_ok(f->db, &o);
  struct dspk__tune_key t = base_tune();
  struct dspk__cache_stats s;
  char data[3000], timings[2900];
  void *p;
  size_t n;
  memset(data, 'x', sizeof data);
  memset(timings, 't', sizeof timings - 1);
  timings[sizeof timings - 1] = '\0';
  assert_int_equal(dspk__cache_tune_put(c, &t, "w", timings), 0); /* the oldest */
  assert_int_equal(dspk__cache_blob_put(c, "b", data, sizeof data), 0);
  assert_int_equal(dspk__cache_blob_put(c, "c", data, sizeof data), 0);
  for (int i = 0; i < 10; i++)
    dspk__cache_tune_used(c, &t);
  /* Nothing written yet: the file still says 0 (one connection of its own). */
  {
    sqlite3 *db;
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_open_v2(f->db, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db, "SELECT hits FROM autotune", -1, &st, NULL),
                     SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    assert_int_equal(sqlite3_column_int64(st, 0), 0);
    sqlite3_finalize(st);
    sqlite3_close(db);
  }
  /* The put evicts b, the least recently used now, not the decision. */
  assert_int_equal(dspk__cache_blob_put(c, "d", data, sizeof data), 0);
  assert_int_equal(dspk__cache_blob_get(c, "b", &p, &n), DSPK_ENOENT);
  char w[8];
  assert_int_equal(dspk__cache_tune_get(c, &t, w, sizeof w), 0);
  assert_string_equal(w, "w");
  for (int i = 0; i < 5; i++)
    dspk__cache_tune_used(c, &t);
  assert_int_equal(dspk__cache_stats(c, &s), 0);
  assert_int_equal(s.kind[DSPK__CACHE_AUTOTUNE].hits, 16);
  assert_int_equal(s.kind[DSPK__CACHE_AUTOTUNE].stored_hits, 16);
  assert_int_equal(s.kind[DSPK__CACHE_BLOBS].evictions, 1);
  /* Uses of more decisions than are kept are written, not lost. */
  for (int i = 0; i < 70; i++) {
    struct dspk__tune_key m = t;
    char shape[16];
    snprintf(shape, sizeof shape, "s%d", i);
    m.shape = shape;
    dspk__cache_tune_used(c, &m);
  }
  dspk__cache_tune_used(c, &t);
  dspk__cache_close(c);
  c = open_ok(f->db, &o);
  assert_int_equal(dspk__cache_stats(c, &s), 0);
  assert_int_equal(s.kind[DSPK__CACHE_AUTOTUNE].stored_hits, 17);
  dspk__cache_close(c);
  dspk__cache_tune_used(NULL, &t);
}

/* A kernel or a blob served from a caller's in-process memo (a loaded
 * module, a plan) counts as used too (dspk__cache_kernel_used with the key
 * of dspk__cache_kernel_id, dspk__cache_blob_used): the put that evicts
 * takes the entry nobody used, and stored_hits counts the memo's uses. */
static void test_memo_uses_kernels_blobs(void **state) {
  struct fixture *f = *state;
  struct dspk__cache_opts o = {.max_bytes = 10000};
  struct dspk__cache *c = open_ok(f->db, &o);
  struct dspk__kernel_key k = base_kernel();
  struct dspk__cache_stats s;
  char data[2800], id[DSPK__HASH_HEX];
  void *p;
  size_t n;
  memset(data, 'x', sizeof data);
  assert_int_equal(dspk__cache_kernel_put(c, &k, data, sizeof data), 0); /* oldest */
  assert_int_equal(dspk__cache_blob_put(c, "wisdom", data, sizeof data), 0);
  assert_int_equal(dspk__cache_blob_put(c, "idle", data, sizeof data), 0);
  dspk__cache_kernel_id(&k, id);
  assert_int_equal(strlen(id), DSPK__HASH_HEX - 1);
  for (int i = 0; i < 4; i++) {
    dspk__cache_kernel_used(c, id);
    dspk__cache_blob_used(c, "wisdom");
  }
  dspk__cache_kernel_used(c, "");   /* no entry: nothing */
  dspk__cache_kernel_used(c, NULL); /* nothing */
  /* The put evicts "idle", the one entry not used since it was stored. */
  assert_int_equal(dspk__cache_blob_put(c, "new", data, sizeof data), 0);
  assert_int_equal(dspk__cache_blob_get(c, "idle", &p, &n), DSPK_ENOENT);
  assert_int_equal(dspk__cache_kernel_get(c, &k, &p, &n), 0);
  free(p);
  assert_int_equal(dspk__cache_blob_get(c, "wisdom", &p, &n), 0);
  free(p);
  assert_int_equal(dspk__cache_stats(c, &s), 0);
  assert_int_equal(s.kind[DSPK__CACHE_KERNELS].stored_hits, 5); /* 4 memo uses, 1 get */
  assert_int_equal(s.kind[DSPK__CACHE_KERNELS].hits, 5);
  assert_int_equal(s.kind[DSPK__CACHE_BLOBS].stored_hits, 5);
  assert_int_equal(s.kind[DSPK__CACHE_BLOBS].evictions, 1);
  /* A decision and a blob of the same key text stay apart. */
  dspk__cache_blob_used(c, id);
  assert_int_equal(dspk__cache_stats(c, &s), 0);
  assert_int_equal(s.kind[DSPK__CACHE_KERNELS].stored_hits, 5);
  dspk__cache_close(c);
  dspk__cache_kernel_used(NULL, id);
  dspk__cache_blob_used(NULL, "wisdom");
}

static void test_clear_by_kind(void **state) {
  struct fixture *f = *state;
  struct dspk__cache *c = open_ok(f->db, NULL);
  struct dspk__kernel_key k = base_kernel();
  struct dspk__tune_key t = base_tune();
  assert_int_equal(dspk__cache_kernel_put(c, &k, "B", 1), 0);
  assert_int_equal(dspk__cache_tune_put(c, &t, "w", NULL), 0);
  assert_int_equal(dspk__cache_blob_put(c, "x", "X", 1), 0);
  assert_int_equal(dspk__cache_clear(c, DSPK__CACHE_MASK(DSPK__CACHE_KERNELS), NULL, 0), 0);
  struct dspk__cache_stats s;
  assert_int_equal(dspk__cache_stats(c, &s), 0);
  assert_int_equal(s.kind[DSPK__CACHE_KERNELS].entries, 0);
  assert_int_equal(s.kind[DSPK__CACHE_KERNELS].bytes, 0);
  assert_int_equal(s.kind[DSPK__CACHE_AUTOTUNE].entries, 1);
  assert_int_equal(s.kind[DSPK__CACHE_BLOBS].entries, 1);
  assert_int_equal(dspk__cache_clear(c, DSPK__CACHE_MASK(DSPK__CACHE_AUTOTUNE) |
                                            DSPK__CACHE_MASK(DSPK__CACHE_BLOBS), NULL, 0),
                   0);
  assert_int_equal(dspk__cache_stats(c, &s), 0);
  for (int i = 0; i < DSPK__CACHE_NKINDS; i++)
    assert_int_equal(s.kind[i].entries, 0);
  assert_int_equal(dspk__cache_clear(c, 8, NULL, 0), DSPK_EINVAL);
  assert_string_equal(dspk__cache_kind_name(DSPK__CACHE_AUTOTUNE), "autotune");
  assert_null(dspk__cache_kind_name(3));
  dspk__cache_close(c);
}

static void fill_some(const char *path) {
  struct dspk__cache *c = open_ok(path, NULL);
  char data[2000];
  for (int i = 0; i < 40; i++) {
    char name[32];
    snprintf(name, sizeof name, "blob-%d", i);
    memset(data, 'a' + i % 26, sizeof data);
    assert_int_equal(dspk__cache_blob_put(c, name, data, sizeof data), 0);
  }
  dspk__cache_close(c);
}

static int count_corrupt(const char *db) {
  char pat[400];
  glob_t g;
  snprintf(pat, sizeof pat, "%s.corrupt-*", db);
  int n = 0;
  if (glob(pat, 0, NULL, &g) == 0) {
    for (size_t i = 0; i < g.gl_pathc; i++)
      if (!strstr(g.gl_pathv[i], "-wal") && !strstr(g.gl_pathv[i], "-shm"))
        n++;
    globfree(&g);
  }
  return n;
}

static void overwrite(const char *path, off_t off, size_t n) {
  int fd = open(path, O_WRONLY);
  assert_true(fd >= 0);
  char junk[4096];
  for (size_t i = 0; i < sizeof junk; i++)
    junk[i] = (char)(i * 37 + 11);
  assert_true(n <= sizeof junk);
  assert_int_equal(pwrite(fd, junk, n, off), (ssize_t)n);
  close(fd);
}

static void check_rebuilt(struct fixture *f) {
  struct dspk__cache *c = NULL;
  char warn[1024] = "";
  assert_int_equal(dspk__cache_open(f->db, NULL, &c, warn, sizeof warn), 0);
  assert_non_null(strstr(warn, "corrupt"));
  assert_non_null(strstr(warn, "rebuilt"));
  assert_false(dspk__cache_in_memory(c));
  assert_int_equal(count_corrupt(f->db), 1);
  assert_int_equal(dspk__cache_check(c), 0);
  void *p;
  size_t n;
  assert_int_equal(dspk__cache_blob_get(c, "blob-1", &p, &n), DSPK_ENOENT);
  assert_int_equal(dspk__cache_blob_put(c, "new", "N", 1), 0);
  dspk__cache_close(c);
  /* The rebuilt file opens cleanly the next time: no second warning. */
  c = open_ok(f->db, NULL);
  assert_int_equal(dspk__cache_blob_get(c, "new", &p, &n), 0);
  free(p);
  dspk__cache_close(c);
  assert_int_equal(count_corrupt(f->db), 1);
}

static void test_corrupt_header(void **state) {
  struct fixture *f = *state;
  fill_some(f->db);
  overwrite(f->db, 0, 100);
  check_rebuilt(f);
}

static void sql_on(const char *path, const char *sql);

/* A cache reached through a symbolic link (put on another disk): a corrupt
 * file, or a damaged schema, is the link's target; the target is moved
 * aside beside itself and rebuilt there, and the link stays, which the
 * warning says. */
static void corrupt_via_link(struct fixture *f, const char *sql) {
  char real[400], link[400], cmd[900];
  struct stat sb;
  snprintf(real, sizeof real, "%s/disk2/real.db", f->dir);
  snprintf(link, sizeof link, "%s/link.db", f->dir);
  snprintf(cmd, sizeof cmd, "rm -rf '%s/disk2' '%s'", f->dir, link);
  assert_int_equal(system(cmd), 0);
  fill_some(real);
  if (sql)
    sql_on(real, sql);
  else
    overwrite(real, 0, 100);
  assert_int_equal(symlink(real, link), 0);
  struct dspk__cache *c = NULL;
  char warn[1400] = "";
  assert_int_equal(dspk__cache_open(link, NULL, &c, warn, sizeof warn), 0);
  if (!strstr(warn, "a symbolic link to") || !strstr(warn, real) ||
      !strstr(warn, "rebuilt it there (the link stays)"))
    fail_msg("warning: %s", warn);
  assert_false(dspk__cache_in_memory(c));
  assert_int_equal(dspk__cache_blob_put(c, "new", "N", 1), 0);
  dspk__cache_close(c);
  assert_int_equal(lstat(link, &sb), 0);
  assert_true(S_ISLNK(sb.st_mode));
  assert_int_equal(count_corrupt(real), 1);
  assert_int_equal(count_corrupt(link), 0);
  assert_int_equal(lstat(real, &sb), 0);
  assert_true(S_ISREG(sb.st_mode));
  /* The rebuilt target is the cache, through the link and by itself. */
  c = open_ok(real, NULL);
  void *p;
  size_t n;
  assert_int_equal(dspk__cache_blob_get(c, "new", &p, &n), 0);
  free(p);
  dspk__cache_close(c);
}

static void test_corrupt_via_link(void **state) {
  corrupt_via_link(*state, NULL);
  corrupt_via_link(*state, "DROP TABLE kernels; CREATE TABLE kernels(x);");
}

/* A second recovery in the same second (a restart loop) keeps the first
 * file aside: each gets a name of its own, and none is replaced.  Files
 * named for this second and the next few are there already (so the names
 * collide whatever the clock does), and none of them is touched. */
static void test_corrupt_twice(void **state) {
  struct fixture *f = *state;
  char name[400], warn[1024];
  struct dspk__cache *c;
  struct stat sb;
  long now = (long)time(NULL);
  glob_t g;
  dspk__cache_close(open_ok(f->db, NULL)); /* its directories */
  for (long t = now; t < now + 10; t++) {
    snprintf(name, sizeof name, "%s.corrupt-%ld", f->db, t);
    FILE *fp = fopen(name, "w");
    assert_non_null(fp);
    fputs("decoy", fp);
    fclose(fp);
  }
  for (int round = 0; round < 3; round++) {
    FILE *fp = fopen(f->db, "w");
    assert_non_null(fp);
    for (int i = 0; i < 1000 * (round + 1); i++)
      fputc('A' + round, fp);
    fclose(fp);
    warn[0] = '\0';
    assert_int_equal(dspk__cache_open(f->db, NULL, &c, warn, sizeof warn), 0);
    assert_non_null(strstr(warn, "rebuilt"));
    dspk__cache_close(c);
  }
  assert_int_equal(count_corrupt(f->db), 13);
  /* The decoys are intact, and the three moved files are all there. */
  int sizes = 0, decoys = 0;
  snprintf(name, sizeof name, "%s.corrupt-*", f->db);
  assert_int_equal(glob(name, 0, NULL, &g), 0);
  for (size_t i = 0; i < g.gl_pathc; i++) {
    assert_int_equal(stat(g.gl_pathv[i], &sb), 0);
    if (sb.st_size == 5)
      decoys++;
    else if (sb.st_size % 1000 == 0 && sb.st_size <= 3000)
      sizes |= 1 << (sb.st_size / 1000 - 1);
  }
  globfree(&g);
  assert_int_equal(decoys, 10);
  assert_int_equal(sizes, 7);
}

static void test_corrupt_page(void **state) {
  struct fixture *f = *state;
  fill_some(f->db);
  /* Break b-tree pages in the middle, keeping the header valid. */
  struct stat sb;
  assert_int_equal(stat(f->db, &sb), 0);
  assert_true(sb.st_size >= 8 * 4096);
  overwrite(f->db, 2 * 4096, 4096);
  overwrite(f->db, 3 * 4096, 4096);
  check_rebuilt(f);
}

/* Opens the cache at path in a child running as uid 65534 (gid 65534):
 * 1 when it fell back to memory with a warning that holds "is unusable (",
 * what (unless NULL) and strerror(err); else 0, the warning on stderr. */
static int unusable_as_nobody(const char *path, const char *what, int err) {
  int status;
  pid_t pid = fork();
  if (pid == 0) {
    struct dspk__cache *cc = NULL;
    char w[1024] = "";
    int ok = setgid(65534) == 0 && setuid(65534) == 0 &&
             dspk__cache_open(path, NULL, &cc, w, sizeof w) == 0 &&
             dspk__cache_in_memory(cc) && strstr(w, "is unusable (") &&
             (!what || strstr(w, what)) && strstr(w, strerror(err));
    if (!ok)
      fprintf(stderr, "%s as uid 65534: %s\n", path, w);
    _exit(ok ? 0 : 1);
  }
  return pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
         WEXITSTATUS(status) == 0;
}

static void test_unwritable_location(void **state) {
  struct fixture *f = *state;
  /* A regular file where a directory should be: mkdir fails even for root. */
  char blocker[300], path[400];
  snprintf(blocker, sizeof blocker, "%s/blocker", f->dir);
  FILE *fp = fopen(blocker, "w");
  assert_non_null(fp);
  fclose(fp);
  snprintf(path, sizeof path, "%s/sub/cache.db", blocker);
  struct dspk__cache *c = NULL;
  char warn[1024] = "";
  assert_int_equal(dspk__cache_open(path, NULL, &c, warn, sizeof warn), 0);
  assert_non_null(strstr(warn, "in-memory"));
  assert_true(dspk__cache_in_memory(c));
  assert_string_equal(dspk__cache_path(c), ":memory:");
  /* It works as a cache. */
  assert_int_equal(dspk__cache_blob_put(c, "x", "X", 1), 0);
  void *p;
  size_t n;
  assert_int_equal(dspk__cache_blob_get(c, "x", &p, &n), 0);
  free(p);
  dspk__cache_close(c);
  /* With no_fallback the same location is an error. */
  struct dspk__cache_opts o = {.no_fallback = 1};
  c = NULL;
  assert_int_equal(dspk__cache_open(path, &o, &c, warn, sizeof warn), DSPK_EIO);
  assert_null(c);

  /* SQLite cannot open it (a file name longer than NAME_MAX, which no
   * capability passes): the warning gives the system's reason, not only
   * SQLite's "unable to open database file". */
  {
    char longname[600];
    int k = snprintf(longname, sizeof longname, "%s/", f->dir);
    memset(longname + k, 'n', 300);
    strcpy(longname + k + 300, ".db");
    warn[0] = '\0';
    assert_int_equal(dspk__cache_open(longname, NULL, &c, warn, sizeof warn), 0);
    assert_true(dspk__cache_in_memory(c));
    assert_non_null(strstr(warn, "is unusable ("));
    assert_non_null(strstr(warn, strerror(ENAMETOOLONG)));
    dspk__cache_close(c);
  }

  /* A directory this user may not write, as root through a child that is
   * uid 65534: the warning says so (it said "No such file or directory",
   * from SQLite's read-only retry). */
  if (geteuid() == 0) {
    char ro[300];
    snprintf(ro, sizeof ro, "%s/rootonly", f->dir);
    assert_int_equal(mkdir(ro, 0755), 0);
    assert_int_equal(chmod(f->dir, 0711), 0); /* traversable, as /var is */
    snprintf(path, sizeof path, "%s/cache.db", ro);
    assert_true(unusable_as_nobody(path, "cannot create it in ", EACCES));
    assert_int_equal(access(path, F_OK), -1);
    chmod(f->dir, 0700);
  }
  /* An existing cache SQLite can only read: the warning gives the system's
   * reason after SQLite's (it said "the file is read-only", even for a
   * read-only file system), as uid 65534 for a file of root's
   * (Permission denied), and on a tmpfs remounted read-only in a mount
   * namespace of a child's own (Read-only file system). */
  if (geteuid() == 0) {
    char dir[300];
    snprintf(dir, sizeof dir, "%s/rofs", f->dir);
    assert_int_equal(mkdir(dir, 0755), 0);
    snprintf(path, sizeof path, "%s/cache.db", dir);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
      struct dspk__cache *cc = NULL;
      char w[1024] = "";
      if (unshare(CLONE_NEWNS) != 0 ||
          mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
          mount("tmpfs", dir, "tmpfs", 0, "mode=0755") != 0)
        _exit(77); /* no mount namespace here */
      int ok = dspk__cache_open(path, NULL, &cc, w, sizeof w) == 0 && !dspk__cache_in_memory(cc);
      dspk__cache_close(cc);
      cc = NULL;
      ok = ok && chmod(path, 0644) == 0 && chmod(f->dir, 0711) == 0 &&
           unusable_as_nobody(path, NULL, EACCES);
      ok = ok && mount(NULL, dir, NULL, MS_REMOUNT | MS_RDONLY, NULL) == 0;
      w[0] = '\0';
      ok = ok && dspk__cache_open(path, NULL, &cc, w, sizeof w) == 0 &&
           dspk__cache_in_memory(cc) && strstr(w, "is unusable (") &&
           strstr(w, strerror(EROFS)) && !strstr(w, "the file is read-only");
      if (!ok)
        fprintf(stderr, "a cache on a read-only file system: %s\n", w);
      dspk__cache_close(cc);
      _exit(ok ? 0 : 1);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    if (WEXITSTATUS(status) == 77)
      fprintf(stderr, "skipped the read-only file system case: no mount namespace\n");
    else
      assert_int_equal(WEXITSTATUS(status), 0);
    chmod(f->dir, 0700);
  }
  /* A read-only directory (meaningful only without CAP_DAC_OVERRIDE). */
  if (geteuid() != 0) {
    char ro[300];
    snprintf(ro, sizeof ro, "%s/ro", f->dir);
    assert_int_equal(mkdir(ro, 0500), 0);
    snprintf(path, sizeof path, "%s/cache.db", ro);
    assert_int_equal(dspk__cache_open(path, NULL, &c, warn, sizeof warn), 0);
    assert_non_null(strstr(warn, "in-memory"));
    assert_true(dspk__cache_in_memory(c));
    dspk__cache_close(c);
    chmod(ro, 0700);
  }
}

static void test_newer_schema(void **state) {
  struct fixture *f = *state;
  fill_some(f->db);
  sqlite3 *db;
  assert_int_equal(sqlite3_open(f->db, &db), SQLITE_OK);
  assert_int_equal(sqlite3_exec(db, "PRAGMA user_version=999", 0, 0, 0), SQLITE_OK);
  sqlite3_close(db);
  struct dspk__cache *c = NULL;
  char warn[1024] = "";
  assert_int_equal(dspk__cache_open(f->db, NULL, &c, warn, sizeof warn), 0);
  assert_non_null(strstr(warn, "newer"));
  assert_true(dspk__cache_in_memory(c));
  dspk__cache_close(c);
  /* The newer file is left alone, not moved aside. */
  assert_int_equal(count_corrupt(f->db), 0);
  assert_int_equal(access(f->db, F_OK), 0);
}

/* ---- what a file is: foreign databases, old caches, damaged schemas ------ */

/* Runs sql on a database at path with the sqlite3 API (creating it). */
static void sql_on(const char *path, const char *sql) {
  sqlite3 *db;
  char *err = NULL;
  assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
  if (sqlite3_exec(db, sql, NULL, NULL, &err) != SQLITE_OK)
    fail_msg("%s: %s", sql, err ? err : "?");
  sqlite3_close(db);
}

static int sql_int(const char *path, const char *sql) {
  sqlite3 *db;
  sqlite3_stmt *st;
  assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
  assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
  assert_int_equal(sqlite3_step(st), SQLITE_ROW);
  int v = sqlite3_column_int(st, 0);
  sqlite3_finalize(st);
  sqlite3_close(db);
  return v;
}

/* The whole file (malloc'd) and its size. */
static char *slurp(const char *path, size_t *n) {
  FILE *fp = fopen(path, "rb");
  assert_non_null(fp);
  assert_int_equal(fseek(fp, 0, SEEK_END), 0);
  long size = ftell(fp);
  assert_true(size >= 0);
  rewind(fp);
  char *buf = malloc((size_t)size + 1);
  assert_non_null(buf);
  assert_int_equal(fread(buf, 1, (size_t)size, fp), (size_t)size);
  fclose(fp);
  *n = (size_t)size;
  return buf;
}

static int exists(const char *path, const char *suffix) {
  char p[512];
  snprintf(p, sizeof p, "%s%s", path, suffix);
  return access(p, F_OK) == 0;
}

/* Opening the cache on path (another program's database) leaves it byte for
 * byte as it was, makes no -wal or -shm file and no .corrupt copy, and runs
 * with an in-memory cache after one warning naming the tables in want. */
static void expect_left_alone(const char *path, const char *want) {
  size_t n0, n1;
  char *before = slurp(path, &n0), *after;
  struct dspk__cache *c = NULL;
  char warn[1024] = "";
  struct dspk__cache_opts strict = {.no_fallback = 1};
  assert_int_equal(dspk__cache_open(path, &strict, &c, warn, sizeof warn), DSPK_EIO);
  assert_null(c);
  assert_int_equal(dspk__cache_open(path, NULL, &c, warn, sizeof warn), 0);
  if (!strstr(warn, "is an SQLite database of another program") ||
      !strstr(warn, want) || !strstr(warn, "leaving it alone; using an in-memory cache"))
    fail_msg("warning: %s", warn);
  assert_true(dspk__cache_in_memory(c));
  assert_string_equal(dspk__cache_path(c), ":memory:");
  assert_int_equal(dspk__cache_blob_put(c, "x", "X", 1), 0);
  dspk__cache_close(c);
  after = slurp(path, &n1);
  assert_int_equal(n0, n1);
  assert_memory_equal(before, after, n0);
  assert_false(exists(path, "-wal"));
  assert_false(exists(path, "-shm"));
  assert_false(exists(path, "-journal"));
  assert_int_equal(count_corrupt(path), 0);
  free(before);
  free(after);
}

static void test_foreign_database(void **state) {
  struct fixture *f = *state;
  char p[400];
  /* The tester's case: rollback journal, one table, user_version 0 (and
   * auto_vacuum FULL, whose header the cache's auto_vacuum would rewrite). */
  snprintf(p, sizeof p, "%s/app.db", f->dir);
  sql_on(p, "PRAGMA auto_vacuum=FULL; CREATE TABLE users(name TEXT);"
            " INSERT INTO users VALUES('alice');");
  expect_left_alone(p, "(table users)");
  assert_int_equal(sql_int(p, "PRAGMA user_version"), 0);
  /* A WAL database, closed (no -wal or -shm beside it). */
  snprintf(p, sizeof p, "%s/wal.db", f->dir);
  sql_on(p, "PRAGMA journal_mode=WAL; CREATE TABLE users(n); CREATE TABLE orders(n);");
  assert_false(exists(p, "-wal"));
  expect_left_alone(p, "(tables orders, users)");
  /* Table names of a dspk cache, but not its columns (and user_version 0):
   * not one, whatever the names. */
  snprintf(p, sizeof p, "%s/kern.db", f->dir);
  sql_on(p, "CREATE TABLE kernels(x); INSERT INTO kernels VALUES(1);");
  expect_left_alone(p, "(table kernels)");
  snprintf(p, sizeof p, "%s/meta.db", f->dir);
  sql_on(p, "CREATE TABLE meta(k, v); CREATE TABLE blobs(name, data);"
            " PRAGMA user_version=1;");
  expect_left_alone(p, "(tables blobs, meta)");
  /* No tables, but marked by another program. */
  snprintf(p, sizeof p, "%s/marked.db", f->dir);
  sql_on(p, "PRAGMA application_id=1234; PRAGMA user_version=3;");
  expect_left_alone(p, "no tables, application_id 1234");
}

/* An empty file (as touch(1) leaves it) becomes a cache, marked. */
static void test_empty_file(void **state) {
  struct fixture *f = *state;
  char p[400];
  snprintf(p, sizeof p, "%s/empty.db", f->dir);
  FILE *fp = fopen(p, "w");
  assert_non_null(fp);
  fclose(fp);
  struct dspk__cache *c = open_ok(p, NULL);
  assert_false(dspk__cache_in_memory(c));
  assert_int_equal(dspk__cache_blob_put(c, "x", "X", 1), 0);
  dspk__cache_close(c);
  assert_int_equal(sql_int(p, "PRAGMA application_id"), 0x4453504b);
  assert_int_equal(sql_int(p, "PRAGMA user_version"), 3);
}

/* A cache made before caches were marked (application_id 0): the schema
 * of version 1 exactly as the code of that time made it, in WAL mode, with
 * an entry.  It is used as it is (no warning, the entry is served) and
 * marked. */
static void test_unmarked_cache(void **state) {
  struct fixture *f = *state;
  fill_some(f->db); /* only to make the directories */
  unlink(f->db);
  sql_on(f->db,
         "PRAGMA auto_vacuum=INCREMENTAL; PRAGMA journal_mode=WAL;"
         "BEGIN IMMEDIATE;"
         "CREATE TABLE meta(k TEXT PRIMARY KEY, v INTEGER NOT NULL) WITHOUT ROWID;"
         "INSERT INTO meta VALUES('tick', 0);"
         "CREATE TABLE kernels("
         " key TEXT PRIMARY KEY, backend TEXT, device TEXT, arch TEXT, uuid TEXT,"
         " driver TEXT, compiler TEXT, compiler_version TEXT, name TEXT,"
         " source_hash TEXT NOT NULL, options TEXT, bin BLOB NOT NULL,"
         " size INTEGER NOT NULL, created INTEGER NOT NULL,"
         " last_used INTEGER NOT NULL, tick INTEGER NOT NULL,"
         " hits INTEGER NOT NULL DEFAULT 0);"
         "CREATE INDEX kernels_tick ON kernels(tick);"
         "CREATE TABLE autotune("
         " key TEXT PRIMARY KEY, op TEXT, shape TEXT, dtypes TEXT, layout TEXT,"
         " backend TEXT, device TEXT, arch TEXT, uuid TEXT, driver TEXT,"
         " cands_hash TEXT NOT NULL, winner TEXT NOT NULL, timings TEXT,"
         " size INTEGER NOT NULL, created INTEGER NOT NULL,"
         " last_used INTEGER NOT NULL, tick INTEGER NOT NULL,"
         " hits INTEGER NOT NULL DEFAULT 0);"
         "CREATE INDEX autotune_tick ON autotune(tick);"
         "CREATE TABLE blobs("
         " name TEXT PRIMARY KEY, data BLOB NOT NULL, size INTEGER NOT NULL,"
         " created INTEGER NOT NULL, last_used INTEGER NOT NULL,"
         " tick INTEGER NOT NULL, hits INTEGER NOT NULL DEFAULT 0);"
         "CREATE INDEX blobs_tick ON blobs(tick);"
         "PRAGMA user_version=1;"
         "UPDATE meta SET v = 1 WHERE k = 'tick';"
         "INSERT INTO blobs VALUES('old', 'OLD', 6, 1, 1, 1, 0);"
         "INSERT INTO kernels(key, name, source_hash, bin, size, created, last_used, tick)"
         " VALUES('k1', 'raw for uid 1000', 'h', 'B', 10, 1, 1, 1),"
         " ('k2', 'gemm', 'h', 'B', 10, 1, 1, 1);"
         "COMMIT;");
  assert_int_equal(sql_int(f->db, "PRAGMA application_id"), 0);
  struct dspk__cache *c = open_ok(f->db, NULL);
  assert_false(dspk__cache_in_memory(c));
  void *p;
  size_t n;
  assert_int_equal(dspk__cache_blob_get(c, "old", &p, &n), 0);
  assert_int_equal(n, 3);
  assert_memory_equal(p, "OLD", 3);
  free(p);
  assert_int_equal(dspk__cache_blob_put(c, "new", "N", 1), 0);
  dspk__cache_close(c);
  assert_int_equal(count_corrupt(f->db), 0);
  /* Migrated to version 2: a client's kernel names its owner; to 3: every
   * entry has its checksum (the old blob was served above: it matched). */
  assert_int_equal(sql_int(f->db, "PRAGMA user_version"), 3);
  assert_int_equal(sql_int(f->db, "SELECT (SELECT count(*) FROM kernels WHERE sum IS NULL)"
                                  " + (SELECT count(*) FROM blobs WHERE sum IS NULL)"), 0);
  assert_int_equal(sql_int(f->db, "SELECT count(*) FROM kernels WHERE key = 'k1'"
                                  " AND owner = 'uid 1000'"), 1);
  assert_int_equal(sql_int(f->db, "SELECT count(*) FROM kernels WHERE key = 'k2'"
                                  " AND owner IS NULL"), 1);
  assert_int_equal(sql_int(f->db, "PRAGMA application_id"), 0x4453504b);
  c = open_ok(f->db, NULL);
  assert_int_equal(dspk__cache_blob_get(c, "old", &p, &n), 0);
  free(p);
  dspk__cache_close(c);
}

/* What opts.dropped was told. */
struct dropped_log {
  int n, kind[8];
  char what[8][320], why[8][320];
};

static void record_dropped(void *ud, int kind, const char *what, const char *why) {
  struct dropped_log *l = ud;
  if (l->n < 8) {
    l->kind[l->n] = kind;
    snprintf(l->what[l->n], sizeof l->what[0], "%s", what);
    snprintf(l->why[l->n], sizeof l->why[0], "%s", why);
  }
  l->n++;
}

/* Entries damaged in place in the file (their bytes changed, the rows
 * otherwise intact, as a bad sector or an edit by hand leaves them) are
 * never served: each get is a miss, not a hit, the entry is deleted and
 * opts.dropped told, and a put makes it again.  Before the checksums the
 * gets served the damaged bytes as hits. */
static void test_damaged_entries(void **state) {
  struct fixture *f = *state;
  struct dropped_log log = {0};
  struct dspk__cache_opts o = {.dropped = record_dropped, .notice_ud = &log};
  struct dspk__kernel_key k = base_kernel();
  struct dspk__tune_key t = base_tune();
  struct dspk__cache *c = open_ok(f->db, &o);
  assert_int_equal(dspk__cache_kernel_put(c, &k, "SPIRV-OK", 8), 0);
  assert_int_equal(dspk__cache_tune_put(c, &t, "direct", "{\"direct\":[1]}"), 0);
  assert_int_equal(dspk__cache_blob_put(c, "fftw-wisdom/f32", "(wisdom)", 8), 0);
  dspk__cache_close(c);
  /* Same sizes, other bytes; the key columns untouched. */
  sql_on(f->db, "UPDATE kernels SET bin = X'0302230700000000ffffffff';"
                "UPDATE autotune SET winner = 'fft';"
                "UPDATE blobs SET data = '(wisdoM)';");
  c = open_ok(f->db, &o);
  void *p = (void *)1;
  size_t n = 0;
  char w[32];
  assert_int_equal(dspk__cache_kernel_get(c, &k, &p, &n), DSPK_ENOENT);
  assert_int_equal(dspk__cache_tune_get(c, &t, w, sizeof w), DSPK_ENOENT);
  assert_int_equal(dspk__cache_blob_get(c, "fftw-wisdom/f32", &p, &n), DSPK_ENOENT);
  assert_int_equal(log.n, 3);
  const int kinds[3] = {DSPK__CACHE_KERNELS, DSPK__CACHE_AUTOTUNE, DSPK__CACHE_BLOBS};
  for (int i = 0; i < 3; i++) {
    assert_int_equal(log.kind[i], kinds[i]);
    assert_non_null(strstr(log.why[i], "checksum does not match"));
  }
  assert_string_equal(log.what[0], "k on NVIDIA H200 (cuda)");
  assert_non_null(strstr(log.what[1], "fir n=2^16,k=2^6 f32 on AMD EPYC"));
  assert_string_equal(log.what[2], "fftw-wisdom/f32");
  struct dspk__cache_stats st;
  assert_int_equal(dspk__cache_stats(c, &st), 0);
  for (int i = 0; i < DSPK__CACHE_NKINDS; i++) {
    assert_int_equal(st.kind[i].entries, 0); /* deleted */
    assert_int_equal(st.kind[i].hits, 0);
    assert_int_equal(st.kind[i].misses, 1);
    assert_int_equal(st.kind[i].stored_hits, 0);
  }
  /* Made again as on a miss: stored and served. */
  assert_int_equal(dspk__cache_kernel_put(c, &k, "SPIRV-OK", 8), 0);
  assert_int_equal(dspk__cache_kernel_get(c, &k, &p, &n), 0);
  assert_int_equal(n, 8);
  assert_memory_equal(p, "SPIRV-OK", 8);
  free(p);
  /* An entry with its checksum intact that its user cannot take: dropped
   * by the caller, that get no longer a hit. */
  assert_int_equal(dspk__cache_kernel_drop(c, &k, "the validator refused it"), 0);
  assert_int_equal(log.n, 4);
  assert_int_equal(log.kind[3], DSPK__CACHE_KERNELS);
  assert_string_equal(log.why[3], "the validator refused it");
  assert_int_equal(dspk__cache_kernel_get(c, &k, &p, &n), DSPK_ENOENT);
  assert_int_equal(dspk__cache_blob_put(c, "b", "B", 1), 0);
  assert_int_equal(dspk__cache_blob_get(c, "b", &p, &n), 0);
  free(p);
  assert_int_equal(dspk__cache_blob_drop(c, "b", "refused"), 0);
  assert_int_equal(dspk__cache_tune_put(c, &t, "direct", NULL), 0);
  assert_int_equal(dspk__cache_tune_get(c, &t, w, sizeof w), 0);
  assert_int_equal(dspk__cache_tune_drop(c, &t, "no such candidate"), 0);
  assert_int_equal(dspk__cache_stats(c, &st), 0);
  assert_int_equal(st.kind[DSPK__CACHE_KERNELS].hits, 0);
  assert_int_equal(st.kind[DSPK__CACHE_KERNELS].misses, 3);
  assert_int_equal(st.kind[DSPK__CACHE_KERNELS].entries, 0);
  assert_int_equal(st.kind[DSPK__CACHE_BLOBS].hits, 0);
  assert_int_equal(st.kind[DSPK__CACHE_BLOBS].entries, 0);
  assert_int_equal(st.kind[DSPK__CACHE_AUTOTUNE].hits, 0);
  assert_int_equal(st.kind[DSPK__CACHE_AUTOTUNE].entries, 0);
  assert_int_equal(log.n, 6);
  dspk__cache_close(c);
}

/* A marked cache whose tables are not those of its version: moved aside
 * and rebuilt, and the warning says what is wrong. */
static void expect_damaged(struct fixture *f, const char *sql, const char *what) {
  fill_some(f->db);
  sql_on(f->db, sql);
  struct dspk__cache *c = NULL;
  char warn[1024] = "";
  struct dspk__cache_opts strict = {.no_fallback = 1};
  assert_int_equal(dspk__cache_open(f->db, &strict, &c, warn, sizeof warn), DSPK_EIO);
  assert_int_equal(dspk__cache_open(f->db, NULL, &c, warn, sizeof warn), 0);
  if (!strstr(warn, "is a dspk cache with a damaged schema") || !strstr(warn, what) ||
      !strstr(warn, "moved it to") || !strstr(warn, "rebuilt it"))
    fail_msg("warning: %s", warn);
  assert_false(dspk__cache_in_memory(c));
  void *p;
  size_t n;
  assert_int_equal(dspk__cache_blob_get(c, "blob-1", &p, &n), DSPK_ENOENT);
  struct dspk__kernel_key k = base_kernel();
  assert_int_equal(dspk__cache_kernel_put(c, &k, "B", 1), 0);
  assert_int_equal(dspk__cache_blob_put(c, "x", "X", 1), 0);
  dspk__cache_close(c);
  assert_int_equal(count_corrupt(f->db), 1);
  dspk__cache_close(open_ok(f->db, NULL));
}

static void test_damaged_schema(void **state) {
  expect_damaged(*state, "DROP TABLE kernels; CREATE TABLE kernels(x);",
                 "(the table kernels does not have the columns this version expects)");
}

static void test_missing_table(void **state) {
  expect_damaged(*state, "DROP TABLE blobs;", "(the table blobs is missing)");
}

/* ---- the file deleted or replaced while open ----------------------------- */

struct notices {
  int n;
  char last[1024];
};

static void on_notice(void *ud, const char *line) {
  struct notices *ns = ud;
  ns->n++;
  snprintf(ns->last, sizeof ns->last, "%s", line);
}

static void unlink_db(const char *path) {
  char p[512];
  assert_int_equal(unlink(path), 0);
  snprintf(p, sizeof p, "%s-wal", path);
  unlink(p);
  snprintf(p, sizeof p, "%s-shm", path);
  unlink(p);
}

static void test_file_deleted(void **state) {
  struct fixture *f = *state;
  struct notices ns = {0};
  struct dspk__cache_opts o = {.notice = on_notice, .notice_ud = &ns};
  struct dspk__cache *c = open_ok(f->db, &o);
  void *p;
  size_t n;
  assert_int_equal(dspk__cache_blob_put(c, "before", "B", 1), 0);
  unlink_db(f->db);
  /* Reads go on from the open file, and tell nothing. */
  assert_int_equal(dspk__cache_blob_get(c, "before", &p, &n), 0);
  free(p);
  assert_int_equal(ns.n, 0);
  /* The next put notices, makes a new file at the path and stores there. */
  assert_int_equal(dspk__cache_blob_put(c, "after", "A", 1), 0);
  assert_int_equal(ns.n, 1);
  if (!strstr(ns.last, "is no longer there (deleted or moved away, or its directory "
                   "was); made a new one at that path") ||
      !strstr(ns.last, f->db))
    fail_msg("notice: %s", ns.last);
  assert_int_equal(access(f->db, F_OK), 0);
  assert_false(dspk__cache_in_memory(c));
  assert_string_equal(dspk__cache_path(c), f->db);
  struct dspk__tune_key t = base_tune();
  assert_int_equal(dspk__cache_tune_put(c, &t, "direct", NULL), 0);
  assert_int_equal(ns.n, 1); /* once */
  struct dspk__cache_stats s;
  assert_int_equal(dspk__cache_stats(c, &s), 0);
  assert_true(s.file_bytes > 0);
  dspk__cache_close(c);
  /* What was stored after the deletion is in the file at the path. */
  c = open_ok(f->db, NULL);
  assert_int_equal(dspk__cache_blob_get(c, "after", &p, &n), 0);
  free(p);
  char w[16];
  assert_int_equal(dspk__cache_tune_get(c, &t, w, sizeof w), 0);
  assert_int_equal(dspk__cache_blob_get(c, "before", &p, &n), DSPK_ENOENT);
  dspk__cache_close(c);
}

/* A file another process holds locked past the busy timeout at open is
 * not "unusable": the warning says it is locked, the cache runs in memory
 * meanwhile, and the first put after the lock is gone moves to the file,
 * copying what was stored in memory. */
static void test_locked_at_open(void **state) {
  struct fixture *f = *state;
  struct notices ns = {0};
  struct dspk__cache_opts o = {.busy_timeout_ms = 100, .notice = on_notice, .notice_ud = &ns};
  struct dspk__cache *c = open_ok(f->db, NULL), *c2;
  struct dspk__cache_stats s;
  char warn[1024] = "";
  sqlite3 *db;
  void *p;
  size_t n;
  assert_int_equal(dspk__cache_blob_put(c, "old", "O", 1), 0);
  dspk__cache_close(c);
  assert_int_equal(sqlite3_open(f->db, &db), SQLITE_OK);
  assert_int_equal(sqlite3_exec(db, "BEGIN EXCLUSIVE", NULL, NULL, NULL), SQLITE_OK);
  assert_int_equal(dspk__cache_open(f->db, &o, &c, warn, sizeof warn), 0);
  if (!strstr(warn, "is locked by another process (database is locked after 100 ms); using an"
                    " in-memory cache until it is free"))
    fail_msg("warn: %s", warn);
  assert_true(dspk__cache_in_memory(c));
  assert_true(dspk__cache_waiting_for_file(c));
  /* no_fallback: EBUSY, not EIO */
  struct dspk__cache_opts nf = {.busy_timeout_ms = 50, .no_fallback = 1};
  assert_int_equal(dspk__cache_open(f->db, &nf, &c2, NULL, 0), DSPK_EBUSY);
  /* Still locked: the put stays in memory, and nothing is told. */
  assert_int_equal(dspk__cache_blob_put(c, "m1", "1", 1), 0);
  assert_true(dspk__cache_in_memory(c));
  assert_int_equal(ns.n, 0);
  assert_int_equal(sqlite3_exec(db, "COMMIT", NULL, NULL, NULL), SQLITE_OK);
  sqlite3_close(db);
  /* Free: the next put uses the file, with what memory held. */
  assert_int_equal(dspk__cache_blob_put(c, "m2", "2", 1), 0);
  assert_false(dspk__cache_in_memory(c));
  assert_false(dspk__cache_waiting_for_file(c));
  assert_int_equal(ns.n, 1);
  if (!strstr(ns.last, "is no longer locked: using it (1 entry stored in memory meanwhile copied"))
    fail_msg("notice: %s", ns.last);
  assert_int_equal(dspk__cache_stats(c, &s), 0);
  assert_false(s.in_memory);
  assert_int_equal(s.kind[DSPK__CACHE_BLOBS].entries, 3);
  dspk__cache_close(c);
  c = open_ok(f->db, NULL);
  const char *names[] = {"old", "m1", "m2"};
  for (int i = 0; i < 3; i++) {
    assert_int_equal(dspk__cache_blob_get(c, names[i], &p, &n), 0);
    free(p);
  }
  assert_int_equal(dspk__cache_check(c), 0);
  dspk__cache_close(c);
}

/* 1 when "<path><suffix>" exists. */
static int side_file_exists(const char *path, const char *suffix) {
  char p[420];
  snprintf(p, sizeof p, "%s%s", path, suffix);
  return access(p, F_OK) == 0;
}

/* Another program's database renamed over the open cache: left alone, the
 * cache goes on in memory. */
static void test_file_replaced(void **state) {
  struct fixture *f = *state;
  struct notices ns = {0};
  struct dspk__cache_opts o = {.notice = on_notice, .notice_ud = &ns};
  struct dspk__cache *c = open_ok(f->db, &o);
  char other[400];
  size_t n0, n1;
  FILE *fp;
  assert_int_equal(dspk__cache_blob_put(c, "before", "B", 1), 0);
  snprintf(other, sizeof other, "%s/app.db", f->dir);
  /* Enough stores that the cache's log holds pages not yet in its file. */
  for (int i = 0; i < 20; i++) {
    char name[16];
    snprintf(name, sizeof name, "more-%d", i);
    assert_int_equal(dspk__cache_blob_put(c, name, "x", 1), 0);
  }
  assert_true(side_file_exists(f->db, "-wal"));
  sql_on(other, "CREATE TABLE users(name TEXT);"
                "INSERT INTO users VALUES ('a'), ('b'), ('c');");
  char keep[420];
  snprintf(keep, sizeof keep, "%s/app.orig", f->dir);
  char *before = slurp(other, &n0);
  fp = fopen(keep, "wb");
  assert_non_null(fp);
  assert_int_equal(fwrite(before, 1, n0, fp), n0);
  fclose(fp);
  assert_int_equal(rename(other, f->db), 0);
  assert_int_equal(dspk__cache_blob_put(c, "after", "A", 1), 0);
  assert_int_equal(ns.n, 1);
  if (!strstr(ns.last, "was replaced while in use") ||
      !strstr(ns.last, "another program (table users)") ||
      !strstr(ns.last, "using an in-memory cache"))
    fail_msg("notice: %s", ns.last);
  assert_true(dspk__cache_in_memory(c));
  assert_string_equal(dspk__cache_path(c), ":memory:");
  void *p;
  size_t n;
  assert_int_equal(dspk__cache_blob_get(c, "after", &p, &n), 0);
  free(p);
  assert_int_equal(dspk__cache_blob_put(c, "more", "M", 1), 0);
  assert_int_equal(ns.n, 1);
  dspk__cache_close(c);
  char *after = slurp(f->db, &n1);
  assert_int_equal(n0, n1);
  assert_memory_equal(before, after, n0);
  free(before);
  free(after);
  /* The old cache's log and index are not left beside it: any open of the
   * path would replay them over the program's database. */
  assert_false(side_file_exists(f->db, "-wal"));
  assert_false(side_file_exists(f->db, "-shm"));
  /* The program opens its database as usual: its table is there, and its
   * own open and close leave the file as it was. */
  assert_int_equal(sql_int(f->db, "SELECT count(*) FROM users"), 3);
  sql_on(f->db, "SELECT count(*) FROM users;");
  after = slurp(f->db, &n1);
  before = slurp(keep, &n0);
  assert_int_equal(n0, n1);
  assert_memory_equal(before, after, n0);
  free(before);
  free(after);
}

/* Bytes that are no database at all renamed over the open cache: judged by
 * their own bytes (not through the old cache's log), so moved aside as a
 * corrupt file, and a new cache is made at the path. */
static void test_garbage_replaced(void **state) {
  struct fixture *f = *state;
  struct notices ns = {0};
  struct dspk__cache_opts o = {.notice = on_notice, .notice_ud = &ns};
  struct dspk__cache *c = open_ok(f->db, &o);
  char other[400], pat[420];
  unsigned char junk[8192];
  size_t n;
  void *p;
  glob_t g;
  for (int i = 0; i < 3; i++) {
    char name[16];
    snprintf(name, sizeof name, "old-%d", i);
    assert_int_equal(dspk__cache_blob_put(c, name, "O", 1), 0);
  }
  assert_true(side_file_exists(f->db, "-wal"));
  for (size_t i = 0; i < sizeof junk; i++)
    junk[i] = (unsigned char)(i * 131 + 7);
  snprintf(other, sizeof other, "%s/junk", f->dir);
  FILE *fp = fopen(other, "wb");
  assert_non_null(fp);
  assert_int_equal(fwrite(junk, 1, sizeof junk, fp), sizeof junk);
  fclose(fp);
  assert_int_equal(rename(other, f->db), 0);
  assert_int_equal(dspk__cache_blob_put(c, "after", "A", 1), 0);
  assert_int_equal(ns.n, 1);
  if (!strstr(ns.last, "was replaced while in use; cache file") ||
      !strstr(ns.last, "was corrupt (its first bytes are not an SQLite header);"
                       " moved it to") ||
      !strstr(ns.last, "and rebuilt it"))
    fail_msg("notice: %s", ns.last);
  assert_false(dspk__cache_in_memory(c));
  assert_int_equal(count_corrupt(f->db), 1);
  snprintf(pat, sizeof pat, "%s.corrupt-*", f->db);
  assert_int_equal(glob(pat, 0, NULL, &g), 0);
  char *kept = slurp(g.gl_pathv[0], &n);
  globfree(&g);
  assert_int_equal(n, sizeof junk);
  assert_memory_equal(kept, junk, sizeof junk);
  free(kept);
  assert_int_equal(dspk__cache_check(c), 0);
  dspk__cache_close(c);
  c = open_ok(f->db, NULL);
  assert_int_equal(dspk__cache_blob_get(c, "after", &p, &n), 0);
  free(p);
  assert_int_equal(dspk__cache_blob_get(c, "old-0", &p, &n), DSPK_ENOENT);
  dspk__cache_close(c);
}

/* A copy of the cache taken earlier (a backup) renamed over the open
 * cache: used as it is, without the entries the replaced file had in its
 * log; and the replaced file, kept under another name, keeps every commit
 * (its log is checkpointed into it first). */
static void test_backup_replaced(void **state) {
  struct fixture *f = *state;
  struct notices ns = {0};
  struct dspk__cache_opts o = {.notice = on_notice, .notice_ud = &ns};
  struct dspk__cache *c = open_ok(f->db, &o);
  struct dspk__cache_stats s;
  char backup[400], moved[400];
  void *p;
  size_t n;
  assert_int_equal(dspk__cache_blob_put(c, "b0", "0", 1), 0);
  dspk__cache_close(c);
  snprintf(backup, sizeof backup, "%s/backup.db", f->dir);
  snprintf(moved, sizeof moved, "%s/moved.db", f->dir);
  size_t len;
  char *bytes = slurp(f->db, &len);
  FILE *fp = fopen(backup, "wb");
  assert_non_null(fp);
  assert_int_equal(fwrite(bytes, 1, len, fp), len);
  fclose(fp);
  free(bytes);
  c = open_ok(f->db, &o);
  for (int i = 1; i < 4; i++) {
    char name[8];
    snprintf(name, sizeof name, "b%d", i);
    assert_int_equal(dspk__cache_blob_put(c, name, "x", 1), 0);
  }
  assert_true(side_file_exists(f->db, "-wal"));
  assert_int_equal(rename(f->db, moved), 0);
  assert_int_equal(rename(backup, f->db), 0);
  assert_int_equal(dspk__cache_blob_put(c, "new", "N", 1), 0);
  assert_int_equal(ns.n, 1);
  if (!strstr(ns.last, "was replaced while in use; now using the cache file at that path"))
    fail_msg("notice: %s", ns.last);
  assert_int_equal(dspk__cache_stats(c, &s), 0);
  assert_int_equal(s.kind[DSPK__CACHE_BLOBS].entries, 2);
  assert_int_equal(dspk__cache_blob_get(c, "b1", &p, &n), DSPK_ENOENT);
  dspk__cache_close(c);
  /* The file moved away holds all four. */
  assert_int_equal(sql_int(moved, "SELECT count(*) FROM blobs"), 4);
}

/* Opens path expecting the in-memory fallback, whose warning has each of
 * the words given (NULL-terminated). */
static void open_refused(const char *path, ...) {
  struct dspk__cache *c = NULL;
  char warn[2048] = "";
  va_list ap;
  assert_int_equal(dspk__cache_open(path, NULL, &c, warn, sizeof warn), 0);
  assert_true(dspk__cache_in_memory(c));
  va_start(ap, path);
  for (const char *w; (w = va_arg(ap, const char *));)
    if (!strstr(warn, w))
      fail_msg("warning lacks \"%s\": %s", w, warn);
  va_end(ap);
  if (!strstr(warn, "using an in-memory cache"))
    fail_msg("not the fallback's warning: %s", warn);
  dspk__cache_close(c);
}

/* A cache that another user could change is never used (outside probe 16
 * E1): a file, or a companion, writable by group or others; a directory
 * writable by them without the sticky bit; and, as root, a file or a
 * directory owned by another user, and another user's symbolic link at
 * the path, whose target a corrupt-file recovery moved aside and rebuilt.
 * Root's and the process's own files, in a sticky directory too, are
 * used; a file the cache makes is 0600 whatever the umask. */
static void test_other_users(void **state) {
  struct fixture *f = *state;
  char dir[320], db[400], side[420], victim[400], link[400], victim_none[400];
  struct stat sb;
  snprintf(dir, sizeof dir, "%s/t", f->dir);
  snprintf(victim_none, sizeof victim_none, "%s/no-such-target", f->dir);
  snprintf(db, sizeof db, "%s/c.db", dir);
  assert_int_equal(mkdir(dir, 0700), 0);

  mode_t old = umask(0);
  struct dspk__cache *c = open_ok(db, NULL);
  umask(old);
  dspk__cache_close(c);
  assert_int_equal(stat(db, &sb), 0);
  assert_int_equal(sb.st_mode & 0777, 0600);

  assert_int_equal(chmod(db, 0666), 0);
  open_refused(db, "the file is writable by group or others (mode 0666)", "chmod go-w", NULL);
  assert_int_equal(chmod(db, 0600), 0);
  snprintf(side, sizeof side, "%s-journal", db);
  int fd = open(side, O_WRONLY | O_CREAT | O_EXCL, 0622);
  assert_true(fd >= 0);
  close(fd);
  assert_int_equal(chmod(side, 0622), 0);
  open_refused(db, side, "writable by group or others (mode 0622)", NULL);
  assert_int_equal(unlink(side), 0);
  assert_int_equal(chmod(dir, 0777), 0);
  open_refused(db, "its directory", "without the sticky bit (mode 0777",
               "give the cache another path", NULL);
  assert_int_equal(chmod(dir, 01777), 0);
  dspk__cache_close(open_ok(db, NULL));
  assert_int_equal(chmod(dir, 0700), 0);
  /* With no cache file yet, a companion that makes the location unusable
   * is left in place with the file the warning names (outside probe 20
   * E1: the clean-up removed it with the empty file made, and the warning
   * said to remove it); the cache file made is removed. */
  char fresh[400], shm[420];
  snprintf(fresh, sizeof fresh, "%s/fresh.db", dir);
  snprintf(shm, sizeof shm, "%s-shm", fresh);
  assert_int_equal(symlink(victim_none, shm), 0);
  open_refused(fresh, shm, "a file SQLite keeps beside it, is a symbolic link", NULL);
  assert_int_equal(lstat(shm, &sb), 0);
  assert_true(S_ISLNK(sb.st_mode));
  assert_int_equal(lstat(fresh, &sb), -1);
  assert_int_equal(unlink(shm), 0);
  if (geteuid() != 0)
    return; /* another owner needs root (ctest runs this as root in CI and here) */

  /* Another user's companions, their contents kept, in a private and in a
   * sticky directory: -wal, -shm and -journal each; and root's link. */
  static const char notes[] = "another user's notes\n";
  static const char *const sides[] = {"-wal", "-shm", "-journal"};
  for (int sticky = 0; sticky < 2; sticky++) {
    assert_int_equal(chmod(dir, sticky ? 01777 : 0700), 0);
    for (size_t i = 0; i < 3; i++) {
      snprintf(side, sizeof side, "%s%s", fresh, sides[i]);
      fd = open(side, O_WRONLY | O_CREAT | O_EXCL, 0600);
      assert_true(fd >= 0);
      assert_int_equal(write(fd, notes, sizeof notes - 1), (ssize_t)(sizeof notes - 1));
      close(fd);
      assert_int_equal(chown(side, 65534, 65534), 0);
      open_refused(fresh, side, "is owned by uid 65534, not by uid 0", "chown it", NULL);
      char kept[sizeof notes] = "";
      fd = open(side, O_RDONLY);
      assert_true(fd >= 0);
      assert_int_equal(read(fd, kept, sizeof kept), (ssize_t)(sizeof notes - 1));
      close(fd);
      assert_string_equal(kept, notes);
      assert_int_equal(lstat(fresh, &sb), -1); /* the file made, removed */
      assert_int_equal(unlink(side), 0);
      assert_int_equal(symlink("/etc/hostname", side), 0);
      open_refused(fresh, side, "is a symbolic link; remove it", NULL);
      assert_int_equal(lstat(side, &sb), 0);
      assert_true(S_ISLNK(sb.st_mode));
      assert_int_equal(unlink(side), 0);
    }
  }
  assert_int_equal(chmod(dir, 0700), 0);

  assert_int_equal(chown(db, 65534, 65534), 0);
  open_refused(db, "the file is owned by uid 65534, not by uid 0", NULL);
  assert_int_equal(chown(db, 0, 0), 0);
  assert_int_equal(chown(dir, 65534, 65534), 0);
  open_refused(db, "its directory", "owned by uid 65534, not by uid 0", NULL);
  assert_int_equal(chown(dir, 0, 0), 0);
  /* Another user's link to a root file, in a sticky directory that user
   * may write: the file is neither moved aside nor rebuilt. */
  static const char text[] = "not a database, root's own file\n";
  snprintf(victim, sizeof victim, "%s/victim.txt", f->dir);
  snprintf(link, sizeof link, "%s/link.db", dir);
  fd = open(victim, O_WRONLY | O_CREAT | O_EXCL, 0600);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, text, sizeof text - 1), (ssize_t)(sizeof text - 1));
  close(fd);
  assert_int_equal(chmod(dir, 01777), 0);
  assert_int_equal(symlink(victim, link), 0);
  assert_int_equal(lchown(link, 65534, 65534), 0);
  open_refused(link, "it is a symbolic link owned by uid 65534, not by uid 0", NULL);
  char got[sizeof text] = "";
  fd = open(victim, O_RDONLY);
  assert_true(fd >= 0);
  assert_int_equal(read(fd, got, sizeof got), (ssize_t)(sizeof text - 1));
  close(fd);
  assert_string_equal(got, text);
  glob_t g;
  char pat[420];
  snprintf(pat, sizeof pat, "%s.corrupt-*", victim);
  assert_int_equal(glob(pat, 0, NULL, &g), GLOB_NOMATCH);
  /* Root's own link is followed, as before (a cache on another disk). */
  assert_int_equal(lchown(link, 0, 0), 0);
  assert_int_equal(unlink(victim), 0);
  dspk__cache_close(open_ok(link, NULL));
  /* Another user's link that names no file yet: refused before anything
   * is made where it points (the cache makes the file a dangling link
   * names, probe 22 E1, but only through root's or its own user's links):
   * the directory it points into is not written at all (its mtime, set in
   * the past, stays), not even for a file made and removed again. */
  char ndir[400], nowhere[420];
  snprintf(ndir, sizeof ndir, "%s/nd", f->dir);
  snprintf(nowhere, sizeof nowhere, "%s/none.db", ndir);
  assert_int_equal(mkdir(ndir, 0700), 0);
  assert_int_equal(unlink(link), 0);
  assert_int_equal(symlink(nowhere, link), 0);
  assert_int_equal(lchown(link, 65534, 65534), 0);
  const struct timespec past[2] = {{1000000000, 0}, {1000000000, 0}};
  assert_int_equal(utimensat(AT_FDCWD, ndir, past, 0), 0);
  open_refused(link, "it is a symbolic link owned by uid 65534, not by uid 0", NULL);
  assert_int_equal(lstat(nowhere, &sb), -1);
  assert_int_equal(stat(ndir, &sb), 0);
  assert_int_equal(sb.st_mtim.tv_sec, 1000000000);
  assert_int_equal(sb.st_mtim.tv_nsec, 0);
  assert_int_equal(chmod(dir, 0700), 0);
}

static void test_default_path(void **state) {
  struct fixture *f = *state;
  char xdg[300], want[400];
  snprintf(xdg, sizeof xdg, "%s/xdg", f->dir);
  snprintf(want, sizeof want, "%s/dspk/cache.db", xdg);
  char *old = getenv("XDG_CACHE_HOME") ? strdup(getenv("XDG_CACHE_HOME")) : NULL;
  setenv("XDG_CACHE_HOME", xdg, 1);
  struct dspk__cache *c = open_ok(NULL, NULL);
  assert_string_equal(dspk__cache_path(c), want);
  dspk__cache_close(c);
  assert_int_equal(access(want, F_OK), 0);
  /* A relative or empty $XDG_CACHE_HOME or $HOME counts as unset (outside
   * probe 16 E2: HOME=rel gave rel/.cache/dspk/cache.db, under / once the
   * daemon had detached): the passwd entry's home instead. */
  char *oldhome = getenv("HOME") ? strdup(getenv("HOME")) : NULL;
  struct passwd *pw = getpwuid(getuid());
  assert_non_null(pw);
  snprintf(want, sizeof want, "%s/.cache/dspk/cache.db", pw->pw_dir);
  static const char *const bad[][2] = {{"rel", "relhome"}, {"", ""}, {"rel/x", "."}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    setenv("XDG_CACHE_HOME", bad[i][0], 1);
    setenv("HOME", bad[i][1], 1);
    char *p = dspk__cache_default_path();
    assert_non_null(p);
    assert_string_equal(p, want);
    free(p);
  }
  if (oldhome) {
    setenv("HOME", oldhome, 1);
    free(oldhome);
  } else {
    unsetenv("HOME");
  }
  if (old) {
    setenv("XDG_CACHE_HOME", old, 1);
    free(old);
  } else {
    unsetenv("XDG_CACHE_HOME");
  }
}

/* Child of test_two_processes: waits for the start signal (EOF on the
 * pipe), then writes n entries, half of them shared with the other child.
 * Exits 0 only when every call succeeded. */
static void writer_child(const char *path, int id, int gate, int n) {
  char b;
  while (read(gate, &b, 1) > 0)
    ;
  struct dspk__cache *c = NULL;
  char warn[512];
  /* Writers that wait for each other (every put must be kept here): the
   * 100 ms a write waits by default gives a put up on a machine loaded
   * enough that the other's commit takes longer (test_write_waits_briefly). */
  struct dspk__cache_opts o = {.busy_timeout_ms = 20000, .write_timeout_ms = 20000};
  if (dspk__cache_open(path, &o, &c, warn, sizeof warn) != 0 || warn[0])
    _exit(2);
  for (int i = 0; i < n; i++) {
    char name[64], data[512];
    int shared = i % 2 == 0;
    snprintf(name, sizeof name, shared ? "shared-%d" : "own-%d-%d",
             shared ? i : id, i);
    memset(data, shared ? 's' : 'a' + id, sizeof data);
    snprintf(data, 32, "%.30s", name);
    if (dspk__cache_blob_put(c, name, data, sizeof data) != 0)
      _exit(3);
    struct dspk__tune_key t = base_tune();
    t.shape = name;
    if (dspk__cache_tune_put(c, &t, shared ? "s" : "o", "{}") != 0)
      _exit(4);
    void *p;
    size_t len;
    if (dspk__cache_blob_get(c, name, &p, &len) != 0)
      _exit(5);
    free(p);
  }
  dspk__cache_close(c);
  _exit(0);
}

static void test_two_processes(void **state) {
  struct fixture *f = *state;
  /* Create the file first so both children find a ready schema; the race
   * of two creators is covered by opening it fresh in both as well. */
  enum { N = 150 };
  for (int round = 0; round < 2; round++) {
    if (round == 1)
      fill_some(f->db);
    int gate[2];
    assert_int_equal(pipe(gate), 0);
    pid_t kid[2];
    for (int id = 0; id < 2; id++) {
      kid[id] = fork();
      assert_true(kid[id] >= 0);
      if (kid[id] == 0) {
        close(gate[1]);
        writer_child(f->db, id, gate[0], N);
      }
    }
    close(gate[0]);
    close(gate[1]); /* both start now */
    for (int id = 0; id < 2; id++) {
      int st;
      assert_int_equal(waitpid(kid[id], &st, 0), kid[id]);
      assert_true(WIFEXITED(st));
      assert_int_equal(WEXITSTATUS(st), 0);
    }
    struct dspk__cache *c = open_ok(f->db, NULL);
    assert_int_equal(dspk__cache_check(c), 0);
    struct dspk__cache_stats s;
    assert_int_equal(dspk__cache_stats(c, &s), 0);
    /* N/2 shared + 2 * N/2 own names, blobs and tunings each. */
    assert_int_equal(s.kind[DSPK__CACHE_BLOBS].entries,
                     N / 2 + N + (round ? 40 : 0));
    assert_int_equal(s.kind[DSPK__CACHE_AUTOTUNE].entries, N / 2 + N);
    void *p;
    size_t len;
    assert_int_equal(dspk__cache_blob_get(c, "own-1-9", &p, &len), 0);
    assert_int_equal(len, 512);
    assert_string_equal((char *)p, "own-1-9");
    assert_int_equal(((char *)p)[511], 'b');
    free(p);
    dspk__cache_close(c);
    if (round == 0) {
      char cmd[1200];
      snprintf(cmd, sizeof cmd, "rm -f '%s' '%s-wal' '%s-shm'", f->db, f->db, f->db);
      assert_int_equal(system(cmd), 0);
    }
  }
}

struct thr {
  struct dspk__cache *c;
  int id;
  int errors;
};

static void *thread_main(void *arg) {
  struct thr *t = arg;
  for (int i = 0; i < 100; i++) {
    struct dspk__kernel_key k = base_kernel();
    char name[32], bin[64];
    snprintf(name, sizeof name, "k%d-%d", t->id, i % 10);
    k.name = name;
    snprintf(bin, sizeof bin, "bin-%s", name);
    void *p;
    size_t n;
    int rc = dspk__cache_kernel_get(t->c, &k, &p, &n);
    if (rc == 0) {
      if (n != strlen(bin) || memcmp(p, bin, n) != 0)
        t->errors++;
      free(p);
    } else if (rc == DSPK_ENOENT) {
      if (dspk__cache_kernel_put(t->c, &k, bin, strlen(bin)) != 0)
        t->errors++;
    } else {
      t->errors++;
    }
  }
  return NULL;
}

static void test_threads(void **state) {
  struct fixture *f = *state;
  struct dspk__cache *c = open_ok(f->db, NULL);
  pthread_t th[4];
  struct thr t[4];
  for (int i = 0; i < 4; i++) {
    t[i] = (struct thr){c, i, 0};
    assert_int_equal(pthread_create(&th[i], NULL, thread_main, &t[i]), 0);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    assert_int_equal(t[i].errors, 0);
  }
  struct dspk__cache_stats s;
  assert_int_equal(dspk__cache_stats(c, &s), 0);
  assert_int_equal(s.kind[DSPK__CACHE_KERNELS].entries, 40);
  assert_int_equal(s.kind[DSPK__CACHE_KERNELS].misses, 40);
  assert_int_equal(s.kind[DSPK__CACHE_KERNELS].hits, 360);
  dspk__cache_close(c);
}

static void test_memory_and_args(void **state) {
  (void)state;
  struct dspk__cache *c = open_ok(":memory:", NULL);
  assert_true(dspk__cache_in_memory(c));
  void *p;
  size_t n;
  assert_int_equal(dspk__cache_blob_get(c, NULL, &p, &n), DSPK_EINVAL);
  assert_int_equal(dspk__cache_blob_put(c, "empty", NULL, 0), 0);
  assert_int_equal(dspk__cache_blob_get(c, "empty", &p, &n), 0);
  assert_int_equal(n, 0);
  free(p);
  dspk__cache_close(c);
  dspk__cache_close(NULL);
}

/* mkdir -p of path's directory. */
static int mkdir_p_parent(const char *path) {
  char cmd[700];
  snprintf(cmd, sizeof cmd, "mkdir -p \"$(dirname '%s')\"", path);
  return system(cmd);
}

/* A path that exists but is not a regular file (a FIFO, a directory, a
 * character device) is refused before SQLite opens it: nothing is created
 * beside it (SQLite made "<path>-journal", /dev/null-journal), and the
 * warning says why. */
static void test_not_regular(void **state) {
  struct fixture *f = *state;
  char fifo[300], dir[300], side[400];
  snprintf(fifo, sizeof fifo, "%s/fifo", f->dir);
  snprintf(dir, sizeof dir, "%s/adir", f->dir);
  assert_int_equal(mkfifo(fifo, 0600), 0);
  assert_int_equal(mkdir(dir, 0700), 0);
  int devnull_journal = access("/dev/null-journal", F_OK) == 0;
  const char *paths[] = {fifo, dir, "/dev/null"};
  const char *kinds[] = {"a FIFO", "a directory", "a character device"};
  for (int i = 0; i < 3; i++) {
    struct dspk__cache *c = NULL;
    char warn[1024] = "";
    assert_int_equal(dspk__cache_open(paths[i], NULL, &c, warn, sizeof warn), 0);
    assert_true(dspk__cache_in_memory(c));
    if (!strstr(warn, "not a regular file") || !strstr(warn, kinds[i]) ||
        !strstr(warn, "in-memory"))
      fail_msg("%s: warn %s", paths[i], warn);
    dspk__cache_close(c);
    static const char *const sfx[] = {"-journal", "-wal", "-shm"};
    for (int k = 0; k < 3; k++) {
      snprintf(side, sizeof side, "%s%s", paths[i], sfx[k]);
      if (i == 2 && k == 0 && devnull_journal)
        continue; /* was there before */
      if (access(side, F_OK) == 0)
        fail_msg("%s was created", side);
    }
    struct dspk__cache_opts o = {.no_fallback = 1};
    c = NULL;
    assert_int_equal(dspk__cache_open(paths[i], &o, &c, warn, sizeof warn), DSPK_EIO);
  }
}

/* A path that ends in "/" names a directory: refused as such, and
 * nothing made (a directory was, and the warning then called the path
 * "a directory" where there had been nothing). */
static void test_trailing_slash(void **state) {
  struct fixture *f = *state;
  char path[310], bare[300];
  struct dspk__cache *c = NULL;
  char warn[1024] = "";
  snprintf(bare, sizeof bare, "%s/none.db", f->dir);
  snprintf(path, sizeof path, "%s/", bare);
  assert_int_equal(dspk__cache_open(path, NULL, &c, warn, sizeof warn), 0);
  assert_true(dspk__cache_in_memory(c));
  if (!strstr(warn, "ends in /: it names a directory, not a file") ||
      strstr(warn, "not a regular file"))
    fail_msg("warn %s", warn);
  dspk__cache_close(c);
  if (access(bare, F_OK) == 0)
    fail_msg("%s was created", bare);
}

struct putres {
  int fails, oks, last_kind, last_err;
  char detail[400];
};

static void on_put_result(void *ud, int kind, int err, const char *detail) {
  struct putres *r = ud;
  if (err < 0)
    r->fails++;
  else
    r->oks++;
  r->last_kind = kind;
  r->last_err = err;
  snprintf(r->detail, sizeof r->detail, "%s", detail);
}

/* Sets the soft RLIMIT_FSIZE (SIGXFSZ ignored: writes past it fail with
 * EFBIG, as on a full file system). */
static void fsize_limit(rlim_t lim) {
  struct rlimit rl;
  assert_int_equal(getrlimit(RLIMIT_FSIZE, &rl), 0);
  rl.rlim_cur = lim == RLIM_INFINITY ? rl.rlim_max : lim;
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &rl), 0);
}

/* Puts that fail in the database (the disk is full) are reported: the
 * return code, opts.put_result (each failure, then once the first success)
 * and the put_errors counter. */
static void test_put_failure_reported(void **state) {
  struct fixture *f = *state;
  struct putres r = {0};
  struct dspk__cache_opts o = {.put_result = on_put_result, .notice_ud = &r};
  struct dspk__cache *c = open_ok(f->db, &o);
  assert_int_equal(dspk__cache_blob_put(c, "small", "S", 1), 0);
  assert_int_equal(r.fails + r.oks, 0); /* nothing to tell */
  static char big[256 * 1024];
  memset(big, 7, sizeof big);
  void (*old)(int) = signal(SIGXFSZ, SIG_IGN);
  fsize_limit(4096);
  int e1 = dspk__cache_blob_put(c, "big1", big, sizeof big);
  struct dspk__kernel_key k = base_kernel();
  int e2 = dspk__cache_kernel_put(c, &k, big, sizeof big);
  fsize_limit(RLIM_INFINITY);
  signal(SIGXFSZ, old);
  assert_true(e1 < 0);
  assert_true(e2 < 0);
  assert_int_equal(r.fails, 2);
  assert_int_equal(r.oks, 0);
  assert_int_equal(r.last_kind, DSPK__CACHE_KERNELS);
  assert_int_equal(r.last_err, e2);
  assert_true(r.detail[0] != '\0');
  assert_string_not_equal(r.detail, "not an error"); /* read before the rollback */
  /* The system's reason follows SQLite's ("disk I/O error" alone named no
   * cause). */
  if (!strstr(r.detail, strerror(EFBIG)))
    fail_msg("put detail: %s", r.detail);
  struct dspk__cache_kstats ks[DSPK__CACHE_NKINDS];
  dspk__cache_counts(c, ks);
  assert_int_equal(ks[DSPK__CACHE_BLOBS].put_errors, 1);
  assert_int_equal(ks[DSPK__CACHE_KERNELS].put_errors, 1);
  assert_int_equal(ks[DSPK__CACHE_BLOBS].puts, 1);
  /* Space again: the next put works and says so once. */
  assert_int_equal(dspk__cache_blob_put(c, "big1", big, sizeof big), 0);
  assert_int_equal(r.oks, 1);
  assert_int_equal(r.last_err, 0);
  assert_int_equal(dspk__cache_blob_put(c, "small2", "s", 1), 0);
  assert_int_equal(r.oks, 1);
  dspk__cache_close(c);
}

/* A VFS over SQLite's "unix" one whose writes fail, while shim_fail is
 * set, with SQLITE_IOERR_WRITE and no errno (as a write of a file SQLite
 * keeps beside the database may: its errno is lost), made the default so
 * that the cache opens through it. */
static sqlite3_vfs shim_vfs, *shim_real;
static sqlite3_io_methods shim_io;
static int shim_fail;
struct shim_file {
  sqlite3_file base;
  sqlite3_file *real; /* the unix VFS's, in the bytes after this struct */
};
#define REAL(f) (((struct shim_file *)(f))->real)
static int shim_close(sqlite3_file *f) { return REAL(f)->pMethods->xClose(REAL(f)); }
static int shim_read(sqlite3_file *f, void *b, int n, sqlite3_int64 o) {
  return REAL(f)->pMethods->xRead(REAL(f), b, n, o);
}
static int shim_write(sqlite3_file *f, const void *b, int n, sqlite3_int64 o) {
  if (shim_fail) {
    errno = 0;
    return SQLITE_IOERR_WRITE;
  }
  return REAL(f)->pMethods->xWrite(REAL(f), b, n, o);
}
static int shim_truncate(sqlite3_file *f, sqlite3_int64 n) {
  return REAL(f)->pMethods->xTruncate(REAL(f), n);
}
static int shim_sync(sqlite3_file *f, int fl) { return REAL(f)->pMethods->xSync(REAL(f), fl); }
static int shim_size(sqlite3_file *f, sqlite3_int64 *n) {
  return REAL(f)->pMethods->xFileSize(REAL(f), n);
}
static int shim_lock(sqlite3_file *f, int l) { return REAL(f)->pMethods->xLock(REAL(f), l); }
static int shim_unlock(sqlite3_file *f, int l) { return REAL(f)->pMethods->xUnlock(REAL(f), l); }
static int shim_reserved(sqlite3_file *f, int *r) {
  return REAL(f)->pMethods->xCheckReservedLock(REAL(f), r);
}
static int shim_fcntl(sqlite3_file *f, int op, void *a) {
  return REAL(f)->pMethods->xFileControl(REAL(f), op, a);
}
static int shim_sector(sqlite3_file *f) { return REAL(f)->pMethods->xSectorSize(REAL(f)); }
static int shim_dev(sqlite3_file *f) {
  return REAL(f)->pMethods->xDeviceCharacteristics(REAL(f));
}
static int shim_shm_map(sqlite3_file *f, int pg, int sz, int ext, void volatile **pp) {
  return REAL(f)->pMethods->xShmMap(REAL(f), pg, sz, ext, pp);
}
static int shim_shm_lock(sqlite3_file *f, int o, int n, int fl) {
  return REAL(f)->pMethods->xShmLock(REAL(f), o, n, fl);
}
static void shim_shm_barrier(sqlite3_file *f) { REAL(f)->pMethods->xShmBarrier(REAL(f)); }
static int shim_shm_unmap(sqlite3_file *f, int del) {
  return REAL(f)->pMethods->xShmUnmap(REAL(f), del);
}
static int shim_fetch(sqlite3_file *f, sqlite3_int64 o, int n, void **pp) {
  return REAL(f)->pMethods->xFetch(REAL(f), o, n, pp);
}
static int shim_unfetch(sqlite3_file *f, sqlite3_int64 o, void *p) {
  return REAL(f)->pMethods->xUnfetch(REAL(f), o, p);
}
static int shim_open(sqlite3_vfs *v, const char *name, sqlite3_file *f, int flags, int *out) {
  (void)v;
  REAL(f) = (sqlite3_file *)((struct shim_file *)f + 1);
  int rc = shim_real->xOpen(shim_real, name, REAL(f), flags, out);
  f->pMethods = REAL(f)->pMethods ? &shim_io : NULL;
  return rc;
}
static int shim_last_error(sqlite3_vfs *v, int n, char *buf) {
  (void)v;
  return shim_fail ? 0 : shim_real->xGetLastError(shim_real, n, buf);
}
static void shim_install(void) {
  shim_real = sqlite3_vfs_find("unix");
  assert_non_null(shim_real);
  shim_vfs = *shim_real;
  shim_vfs.zName = "dspk-test-shim";
  shim_vfs.szOsFile = (int)sizeof(struct shim_file) + shim_real->szOsFile;
  shim_vfs.xOpen = shim_open;
  shim_vfs.xGetLastError = shim_last_error;
  shim_io = (sqlite3_io_methods){3, shim_close, shim_read, shim_write, shim_truncate,
                                 shim_sync, shim_size, shim_lock, shim_unlock, shim_reserved,
                                 shim_fcntl, shim_sector, shim_dev, shim_shm_map,
                                 shim_shm_lock, shim_shm_barrier, shim_shm_unmap, shim_fetch,
                                 shim_unfetch};
  assert_int_equal(sqlite3_vfs_register(&shim_vfs, 1), SQLITE_OK);
}
static void shim_remove(void) {
  sqlite3_vfs_unregister(&shim_vfs);
  sqlite3_vfs_register(shim_real, 1);
}

/* An I/O error without an errno under a finite RLIMIT_FSIZE that no file of
 * the cache's is near: it is not "File too large" (it was, whenever the
 * limit was finite), but SQLite's own message; with the files at the limit
 * it is (test_put_failure_reported). */
static void test_put_failure_not_fsize(void **state) {
  struct fixture *f = *state;
  struct putres r = {0};
  struct dspk__cache_opts o = {.put_result = on_put_result, .notice_ud = &r};
  static char val[8192];
  char why[256] = "";
  shim_install();
  struct dspk__cache *c = open_ok(f->db, &o);
  assert_int_equal(dspk__cache_blob_put(c, "a", "A", 1), 0);
  memset(val, 9, sizeof val);
  void (*old)(int) = signal(SIGXFSZ, SIG_IGN);
  fsize_limit(1 << 30);
  shim_fail = 1;
  int e = dspk__cache_blob_put(c, "b", val, sizeof val);
  int ec = dspk__cache_clear(c, DSPK__CACHE_ALL, why, sizeof why);
  shim_fail = 0;
  fsize_limit(RLIM_INFINITY);
  signal(SIGXFSZ, old);
  assert_true(e < 0);
  assert_int_equal(r.fails, 1);
  if (strstr(r.detail, strerror(EFBIG)) || strstr(r.detail, "RLIMIT_FSIZE"))
    fail_msg("put detail: %s", r.detail);
  assert_non_null(strstr(r.detail, "disk I/O error"));
  assert_true(ec < 0);
  if (strstr(why, strerror(EFBIG)) || strstr(why, "RLIMIT_FSIZE"))
    fail_msg("clear: %s", why);
  /* Writes again: it works. */
  assert_int_equal(dspk__cache_blob_put(c, "b", val, sizeof val), 0);
  dspk__cache_close(c);
  shim_remove();
}

/* An entry larger than the cache's bound (or, a client's kernel, than its
 * share of it) was refused without a word: misses went up, puts and
 * put_errors stayed 0, nothing was logged, so a bound too small for the
 * entries went unseen.  It is a failed put, counted and told. */
static void test_put_too_large_reported(void **state) {
  struct fixture *f = *state;
  struct putres r = {0};
  struct dspk__cache_opts o = {.put_result = on_put_result, .notice_ud = &r,
                               .max_bytes = 16384};
  struct dspk__cache *c = open_ok(f->db, &o);
  static char big[32 * 1024];
  memset(big, 3, sizeof big);
  assert_int_equal(dspk__cache_blob_put(c, "big", big, sizeof big), DSPK_ELIMIT);
  assert_int_equal(r.fails, 1);
  assert_int_equal(r.last_kind, DSPK__CACHE_BLOBS);
  assert_int_equal(r.last_err, DSPK_ELIMIT);
  assert_non_null(strstr(r.detail, "is larger than the cache's size bound (16384 bytes)"));
  struct dspk__kernel_key k = base_kernel();
  k.owner = "uid 1000"; /* a client's: a quarter of the bound */
  assert_int_equal(dspk__cache_kernel_put(c, &k, big, 8192), DSPK_ELIMIT);
  assert_int_equal(r.last_kind, DSPK__CACHE_KERNELS);
  assert_non_null(strstr(r.detail, "a client's share of the cache's size bound (4096 bytes)"));
  struct dspk__cache_kstats ks[DSPK__CACHE_NKINDS];
  dspk__cache_counts(c, ks);
  assert_int_equal(ks[DSPK__CACHE_BLOBS].put_errors, 1);
  assert_int_equal(ks[DSPK__CACHE_KERNELS].put_errors, 1);
  assert_int_equal(ks[DSPK__CACHE_BLOBS].puts, 0);
  /* One that fits is stored, and nothing says "works again" (no put failed
   * in the database). */
  assert_int_equal(dspk__cache_blob_put(c, "small", "s", 1), 0);
  assert_int_equal(r.oks, 0);
  dspk__cache_close(c);
}

/* A clear that the database cannot write (the disk is full) fails as a
 * whole, and says why: the statement and SQLite's message (it answered
 * "i/o error" alone); every entry is still there. */
static void test_clear_failure_says_why(void **state) {
  struct fixture *f = *state;
  struct dspk__cache *c = open_ok(f->db, NULL);
  static char big[64 * 1024];
  char key[16], why[256] = "x";
  memset(big, 5, sizeof big);
  for (int i = 0; i < 16; i++) {
    snprintf(key, sizeof key, "b%d", i);
    assert_int_equal(dspk__cache_blob_put(c, key, big, sizeof big), 0);
  }
  void (*old)(int) = signal(SIGXFSZ, SIG_IGN);
  fsize_limit(4096);
  int e = dspk__cache_clear(c, DSPK__CACHE_ALL, why, sizeof why);
  fsize_limit(RLIM_INFINITY);
  signal(SIGXFSZ, old);
  assert_true(e < 0);
  /* Past RLIMIT_FSIZE a write fails with EFBIG, which SQLite calls a disk
   * I/O error (ENOSPC: "database or disk is full"). */
  assert_true(strstr(why, ": disk I/O error") || strstr(why, ": database or disk is full"));
  if (!strstr(why, strerror(EFBIG)))
    fail_msg("clear: %s", why);
  assert_true(strncmp(why, "DELETE FROM ", 12) == 0 || strncmp(why, "COMMIT: ", 8) == 0);
  struct dspk__cache_stats s;
  assert_int_equal(dspk__cache_stats(c, &s), 0);
  assert_int_equal(s.kind[DSPK__CACHE_BLOBS].entries, 16);
  /* Space again: it works, and why is empty. */
  assert_int_equal(dspk__cache_clear(c, DSPK__CACHE_ALL, why, sizeof why), 0);
  assert_string_equal(why, "");
  dspk__cache_close(c);
}

/* Every warning about a system call that failed gives the system's
 * reason: a file size limit below what a new cache needs (it said "disk
 * I/O error" alone), at 0 and at 40 KiB (the file made, its log not), and
 * a writable cache in a directory its user cannot write, where the -wal
 * cannot be made (it said "attempt to write a readonly database", which
 * blames the file). */
static void test_open_says_why(void **state) {
  struct fixture *f = *state;
  struct dspk__cache *c = NULL;
  char warn[1024] = "";
  static const rlim_t limits[] = {0, 40 * 1024};
  assert_int_equal(mkdir_p_parent(f->db), 0);
  for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++) {
    void (*old)(int) = signal(SIGXFSZ, SIG_IGN);
    fsize_limit(limits[i]);
    c = NULL;
    int rc = dspk__cache_open(f->db, NULL, &c, warn, sizeof warn);
    fsize_limit(RLIM_INFINITY);
    signal(SIGXFSZ, old);
    assert_int_equal(rc, 0);
    assert_true(dspk__cache_in_memory(c));
    if (!strstr(warn, "is unusable (") || !strstr(warn, strerror(EFBIG)))
      fail_msg("RLIMIT_FSIZE %llu: %s", (unsigned long long)limits[i], warn);
    dspk__cache_close(c);
  }
  if (geteuid() == 0) {
    char dir[300], path[400], cmd[900];
    snprintf(dir, sizeof dir, "%s/nobodys", f->dir);
    snprintf(path, sizeof path, "%s/cache.db", dir);
    assert_int_equal(mkdir(dir, 0755), 0);
    dspk__cache_close(open_ok(path, NULL));
    snprintf(cmd, sizeof cmd, "rm -f '%s-wal' '%s-shm'", path, path);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(chown(dir, 65534, 65534), 0);
    assert_int_equal(chown(path, 65534, 65534), 0);
    assert_int_equal(chmod(path, 0644), 0);
    assert_int_equal(chmod(dir, 0555), 0);
    assert_int_equal(chmod(f->dir, 0711), 0);
    assert_true(unusable_as_nobody(path, "cannot create", EACCES));
    chmod(f->dir, 0700);
    chmod(dir, 0755);
  }
}

/* Opening where nothing can be written (a full disk): the fallback to
 * memory leaves no file behind that the open itself created. */
static void test_open_full_leaves_nothing(void **state) {
  struct fixture *f = *state;
  struct dspk__cache *c = NULL;
  char warn[1024] = "";
  assert_int_equal(mkdir_p_parent(f->db), 0);
  void (*old)(int) = signal(SIGXFSZ, SIG_IGN);
  fsize_limit(0);
  int rc = dspk__cache_open(f->db, NULL, &c, warn, sizeof warn);
  fsize_limit(RLIM_INFINITY);
  signal(SIGXFSZ, old);
  assert_int_equal(rc, 0);
  assert_true(dspk__cache_in_memory(c));
  if (!strstr(warn, "in-memory"))
    fail_msg("warn: %s", warn);
  dspk__cache_close(c);
  char side[400];
  static const char *const sfx[] = {"", "-journal", "-wal", "-shm"};
  for (int i = 0; i < 4; i++) {
    snprintf(side, sizeof side, "%s%s", f->db, sfx[i]);
    if (access(side, F_OK) == 0)
      fail_msg("%s was left behind", side);
  }
  /* Directories the open made for the file go too. */
  char deep[400], top[400];
  snprintf(top, sizeof top, "%s/new1", f->dir);
  snprintf(deep, sizeof deep, "%s/new1/new2/cache.db", f->dir);
  signal(SIGXFSZ, SIG_IGN);
  fsize_limit(0);
  c = NULL;
  rc = dspk__cache_open(deep, NULL, &c, warn, sizeof warn);
  fsize_limit(RLIM_INFINITY);
  signal(SIGXFSZ, old);
  assert_int_equal(rc, 0);
  assert_true(dspk__cache_in_memory(c));
  dspk__cache_close(c);
  if (access(top, F_OK) == 0)
    fail_msg("%s was left behind", top);
  /* A file that was there before is never removed. */
  FILE *fp = fopen(f->db, "w");
  assert_non_null(fp);
  fclose(fp);
  signal(SIGXFSZ, SIG_IGN);
  fsize_limit(0);
  c = NULL;
  rc = dspk__cache_open(f->db, NULL, &c, warn, sizeof warn);
  fsize_limit(RLIM_INFINITY);
  signal(SIGXFSZ, old);
  assert_int_equal(rc, 0);
  dspk__cache_close(c);
  assert_int_equal(access(f->db, F_OK), 0);
}

/* The mode of path (lstat), its permission bits. */
static mode_t mode_of(const char *path) {
  struct stat sb;
  if (lstat(path, &sb) != 0)
    fail_msg("%s: %s", path, strerror(errno));
  return sb.st_mode & 07777;
}

/* The cache file at db, its -wal and its -shm are mode 0600. */
static void check_private(const char *db, const char *when) {
  static const char *const side[] = {"", "-wal", "-shm"};
  char p[480];
  for (int i = 0; i < 3; i++) {
    snprintf(p, sizeof p, "%s%s", db, side[i]);
    mode_t m = mode_of(p);
    if (m != 0600)
      fail_msg("%s: %s is mode %04o, want 0600", when, p, (unsigned)m);
  }
}

/* dspk__cache_open of path under umask mask (restored after), then a put;
 * the warning in warn. */
static struct dspk__cache *open_under(const char *path, mode_t mask,
                                      const struct dspk__cache_opts *o, char *warn,
                                      size_t len) {
  struct dspk__cache *c = NULL;
  mode_t old = umask(mask);
  warn[0] = '\0';
  int r = dspk__cache_open(path, o, &c, warn, len);
  int put = r == 0 ? dspk__cache_blob_put(c, "x", "X", 1) : -1;
  umask(old);
  assert_int_equal(r, 0);
  assert_int_equal(put, 0);
  assert_false(dspk__cache_in_memory(c));
  return c;
}

/* Every file and directory the cache makes has its documented mode
 * whatever the umask (0, 022 and 0777): its directories 0700, the file
 * and the -wal and -shm SQLite makes beside it 0600, on every path that
 * makes one (probe 22 E1, E2: a file rebuilt after corruption was made by
 * SQLite, mode 0644 & ~umask, so 0644 under umask 022; the directories and
 * a fresh file took the umask, mode 000 under 0777): a fresh cache, one
 * rebuilt after corruption (the file's header, its pages), one made again
 * after the file was deleted while in use, and one made through an
 * admin's symbolic link that names no file yet, then rebuilt there. */
static void test_modes_any_umask(void **state) {
  struct fixture *f = *state;
  static const mode_t masks[] = {0, 022, 0777};
  char warn[1400];
  for (size_t k = 0; k < sizeof masks / sizeof masks[0]; k++) {
    char dir[320], db[400], p[420], real[400], link[400], when[64];
    struct dspk__cache *c;
    snprintf(dir, sizeof dir, "%s/u%03o", f->dir, (unsigned)masks[k]);
    snprintf(db, sizeof db, "%s/a/b/c.db", dir);

    snprintf(when, sizeof when, "fresh, umask %03o", (unsigned)masks[k]);
    c = open_under(db, masks[k], NULL, warn, sizeof warn);
    assert_string_equal(warn, "");
    check_private(db, when);
    snprintf(p, sizeof p, "%s/a", dir);
    assert_int_equal(mode_of(p), 0700);
    snprintf(p, sizeof p, "%s/a/b", dir);
    assert_int_equal(mode_of(p), 0700);
    dspk__cache_close(c);

    /* Corrupt at the header, then in its pages (mode 0644 before: the
     * file's own mode makes no difference). */
    for (int how = 0; how < 2; how++) {
      snprintf(when, sizeof when, "rebuilt (%s), umask %03o", how ? "pages" : "header",
               (unsigned)masks[k]);
      fill_some(db);
      assert_int_equal(chmod(db, 0644), 0);
      if (how)
        overwrite(db, 2 * 4096, 4096), overwrite(db, 3 * 4096, 4096);
      else
        overwrite(db, 0, 100);
      c = open_under(db, masks[k], NULL, warn, sizeof warn);
      if (!strstr(warn, "rebuilt it"))
        fail_msg("%s: warning: %s", when, warn);
      check_private(db, when);
      dspk__cache_close(c);
    }

    snprintf(when, sizeof when, "made again after a deletion, umask %03o", (unsigned)masks[k]);
    struct notices ns = {0};
    struct dspk__cache_opts o = {.notice = on_notice, .notice_ud = &ns};
    c = open_under(db, masks[k], &o, warn, sizeof warn);
    unlink_db(db);
    mode_t old = umask(masks[k]);
    int put = dspk__cache_blob_put(c, "after", "A", 1);
    umask(old);
    assert_int_equal(put, 0);
    if (ns.n != 1 || !strstr(ns.last, "(deleted or moved away, or its directory was); made a new one"))
      fail_msg("%s: notice: %s", when, ns.last);
    check_private(db, when);
    dspk__cache_close(c);

    /* Through a link whose target is not there yet (SQLite made the
     * target, 0644), then that target rebuilt after corruption. */
    snprintf(when, sizeof when, "through a dangling link, umask %03o", (unsigned)masks[k]);
    snprintf(p, sizeof p, "%s/disk2", dir);
    assert_int_equal(mkdir(p, 0700), 0);
    snprintf(real, sizeof real, "%s/disk2/real.db", dir);
    snprintf(link, sizeof link, "%s/link.db", dir);
    assert_int_equal(symlink("disk2/real.db", link), 0);
    c = open_under(link, masks[k], NULL, warn, sizeof warn);
    assert_string_equal(warn, "");
    check_private(real, when);
    struct stat lsb;
    assert_int_equal(lstat(link, &lsb), 0);
    assert_true(S_ISLNK(lsb.st_mode)); /* the link stays a link */
    dspk__cache_close(c);
    overwrite(real, 0, 100);
    snprintf(when, sizeof when, "rebuilt through a link, umask %03o", (unsigned)masks[k]);
    c = open_under(link, masks[k], NULL, warn, sizeof warn);
    if (!strstr(warn, "rebuilt it there (the link stays)"))
      fail_msg("%s: warning: %s", when, warn);
    check_private(real, when);
    dspk__cache_close(c);
  }
}

#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)

/* A child process that holds a lock on path until the parent closes
 * *release: kind 'w' a write transaction (BEGIN IMMEDIATE, through SQLite),
 * 'p' an fcntl(2) write lock on the whole file.  Returns once it holds it. */
static pid_t hold_lock(const char *path, int kind, int *release) {
  int ready[2], go[2];
  char b = 0;
  assert_int_equal(pipe(ready), 0);
  assert_int_equal(pipe(go), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    sqlite3 *db = NULL;
    close(ready[0]);
    close(go[1]);
    if (kind == 'w') {
      if (sqlite3_open(path, &db) != SQLITE_OK ||
          sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK)
        _exit(1);
    } else {
      struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
      int fd = open(path, O_RDWR);
      if (fd < 0 || fcntl(fd, F_SETLK, &fl) != 0)
        _exit(1);
    }
    if (write(ready[1], "x", 1) != 1)
      _exit(1);
    while (read(go[0], &b, 1) > 0)
      ;
    if (db)
      sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
    _exit(0);
  }
  close(ready[1]);
  close(go[0]);
  assert_int_equal(read(ready[0], &b, 1), 1); /* it holds the lock */
  close(ready[0]);
  *release = go[1];
  return pid;
}

static void release_lock(pid_t pid, int release) {
  int st;
  close(release);
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* While another process holds the file's write lock (BEGIN IMMEDIATE), a
 * put waits briefly (write_timeout_ms) and is given up with DSPK_EBUSY,
 * reported and counted, and a hit's recency is dropped: neither waits for
 * the busy timeout of the open, here 10 minutes (outside probe 15 E4: each
 * put waited 5 s on a runner, and the tasks of every client behind it).
 * Once the lock is let go, puts are stored again. */
static void test_write_waits_briefly(void **state) {
  struct fixture *f = *state;
  struct putres r = {0};
  struct dspk__cache_opts o = {.busy_timeout_ms = 600000, .put_result = on_put_result,
                               .notice_ud = &r};
  struct dspk__cache *c = open_ok(f->db, &o);
  struct dspk__cache_stats s;
  int release;
  void *p;
  size_t n;
  assert_int_equal(dspk__cache_blob_put(c, "a", "A", 1), 0);
  pid_t pid = hold_lock(f->db, 'w', &release);
  assert_int_equal(dspk__cache_blob_put(c, "b", "B", 1), DSPK_EBUSY);
  assert_int_equal(r.fails, 1);
  assert_int_equal(r.last_err, DSPK_EBUSY);
  if (!strstr(r.detail, "database is locked"))
    fail_msg("detail: %s", r.detail);
  struct dspk__tune_key tk = base_tune();
  assert_int_equal(dspk__cache_tune_put(c, &tk, "w", NULL), DSPK_EBUSY);
  /* A hit is served (its recency update is dropped). */
  assert_int_equal(dspk__cache_blob_get(c, "a", &p, &n), 0);
  assert_true(n == 1 && memcmp(p, "A", 1) == 0);
  free(p);
  release_lock(pid, release);
  assert_int_equal(dspk__cache_blob_put(c, "c", "C", 1), 0);
  assert_int_equal(r.oks, 1);
  assert_int_equal(dspk__cache_stats(c, &s), 0);
  assert_int_equal(s.kind[DSPK__CACHE_BLOBS].entries, 2);
  assert_int_equal(s.kind[DSPK__CACHE_BLOBS].put_errors, 1);
  assert_int_equal(s.kind[DSPK__CACHE_AUTOTUNE].put_errors, 1);
  assert_int_equal(dspk__cache_blob_get(c, "b", &p, &n), DSPK_ENOENT);
  dspk__cache_close(c);
}

/* Files of other processes at the cache's path are left alone, byte for
 * byte (outside probe 15 E1): a file another process holds an flock(2) on
 * (another daemon's lock file, empty: SQLite made a database in it), the
 * write-ahead log of another open cache (taken for a corrupt cache and
 * moved aside: that cache lost its entries), and a corrupt file another
 * process holds an fcntl(2) lock on (never moved aside under it). */
static void test_others_files_left_alone(void **state) {
  struct fixture *f = *state;
  struct dspk__cache *c = open_ok(f->db, NULL), *c2 = NULL;
  char path[400], wal[400], warn[1024] = "";
  struct stat before, after;
  int release;
  void *p;
  size_t n;
  /* A lock file, held. */
  snprintf(path, sizeof path, "%s/x.lock", f->dir);
  int fd = open(path, O_RDWR | O_CREAT, 0600);
  assert_true(fd >= 0);
  assert_int_equal(flock(fd, LOCK_EX), 0);
  assert_int_equal(dspk__cache_open(path, NULL, &c2, warn, sizeof warn), 0);
  if (!strstr(warn, "is a file another process holds an flock(2) on (a lock file): leaving it"
                    " alone; using an in-memory cache"))
    fail_msg("warn: %s", warn);
  assert_true(dspk__cache_in_memory(c2));
  dspk__cache_close(c2);
  assert_int_equal(stat(path, &after), 0);
  assert_int_equal(after.st_size, 0);
  close(fd);
  /* The -wal of the open cache c. */
  assert_int_equal(dspk__cache_blob_put(c, "k", "K", 1), 0);
  snprintf(wal, sizeof wal, "%s-wal", f->db);
  assert_int_equal(stat(wal, &before), 0);
  assert_int_equal(dspk__cache_open(wal, NULL, &c2, warn, sizeof warn), 0);
  if (!strstr(warn, "is an SQLite write-ahead log (another database's -wal): leaving it alone"))
    fail_msg("warn: %s", warn);
  dspk__cache_close(c2);
  assert_int_equal(stat(wal, &after), 0);
  assert_true(after.st_ino == before.st_ino && after.st_size == before.st_size);
  assert_int_equal(dspk__cache_blob_get(c, "k", &p, &n), 0);
  free(p);
  dspk__cache_close(c);
  /* A corrupt file in use. */
  snprintf(path, sizeof path, "%s/garbage.db", f->dir);
  FILE *g = fopen(path, "w");
  assert_non_null(g);
  fputs("not a database, but someone's file\n", g);
  fclose(g);
  pid_t pid = hold_lock(path, 'p', &release);
  assert_int_equal(dspk__cache_open(path, NULL, &c2, warn, sizeof warn), 0);
  if (!strstr(warn, "(its first bytes are not an SQLite header), but another process holds a"
                    " lock on it: leaving it alone"))
    fail_msg("warn: %s", warn);
  assert_true(dspk__cache_in_memory(c2));
  dspk__cache_close(c2);
  release_lock(pid, release);
  glob_t gl;
  char pat[420];
  snprintf(pat, sizeof pat, "%s.corrupt-*", path);
  assert_int_equal(glob(pat, 0, NULL, &gl), GLOB_NOMATCH);
  assert_int_equal(stat(path, &after), 0);
  assert_int_equal(after.st_size, 35);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      T(test_hash_vectors),
      T(test_owner_share),
      T(test_kernel_miss_source),
      T(test_kernel_miss_options),
      T(test_kernel_miss_compiler_version),
      T(test_kernel_miss_compiler),
      T(test_kernel_miss_device),
      T(test_kernel_miss_uuid),
      T(test_kernel_miss_arch),
      T(test_kernel_miss_driver),
      T(test_kernel_miss_backend),
      T(test_kernel_miss_name),
      T(test_kernel_miss_owner),
      T(test_kernel_miss_other_owner),
      T(test_tune_components),
      T(test_persistence),
      T(test_lru_eviction),
      T(test_memo_uses_count),
      T(test_memo_uses_kernels_blobs),
      T(test_clear_by_kind),
      T(test_clear_failure_says_why),
      T(test_corrupt_header),
      T(test_corrupt_via_link),
      T(test_open_says_why),
      T(test_corrupt_page),
      T(test_corrupt_twice),
      T(test_unwritable_location),
      T(test_newer_schema),
      T(test_foreign_database),
      T(test_empty_file),
      T(test_unmarked_cache),
      T(test_damaged_entries),
      T(test_damaged_schema),
      T(test_missing_table),
      T(test_file_deleted),
      T(test_locked_at_open),
      T(test_file_replaced),
      T(test_garbage_replaced),
      T(test_backup_replaced),
      T(test_default_path),
      T(test_other_users),
      T(test_modes_any_umask),
      T(test_two_processes),
      T(test_threads),
      T(test_memory_and_args),
      T(test_not_regular),
      T(test_trailing_slash),
      T(test_put_failure_reported),
      T(test_put_failure_not_fsize),
      T(test_put_too_large_reported),
      T(test_open_full_leaves_nothing),
      T(test_write_waits_briefly),
      T(test_others_files_left_alone),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
