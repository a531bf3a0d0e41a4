/*
 * The persistent cache over SQLite: opening (default location, directory
 * creation, WAL, busy timeout, schema migrations, corruption recovery,
 * in-memory fallback), the three kinds of entry (compiled kernels, autotune
 * decisions, named blobs), least-recently-used eviction under a size bound,
 * stats and clearing.
 *
 * One connection behind one mutex serves every thread of the process; each
 * API call is one short transaction (BEGIN IMMEDIATE for writes, so that a
 * writer waits on the busy timeout instead of failing on a lock upgrade).
 * Recency is a logical clock (meta.tick, bumped by every put and every hit)
 * rather than wall time, so the eviction order is exact even for entries
 * touched within the same microsecond, and holds across processes sharing
 * the file.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include "cache/cache.h"

#define DEFAULT_MAX_BYTES (UINT64_C(256) << 20)
#define DEFAULT_BUSY_MS 5000

/* Atomics, so dspk__cache_counts() reads them without the mutex, which a
 * statement may hold for as long as SQLite's busy timeout. */
struct kcount {
  _Atomic uint64_t hits, misses, puts, evictions;
};

struct dspk__cache {
  pthread_mutex_t mu;
  sqlite3 *db;
  char *path;
  int in_memory;
  uint64_t max_bytes;
  struct kcount count[DSPK__CACHE_NKINDS];
  _Atomic uint64_t epoch;
};

/* Source of epochs: unique across every cache opened in the process. */
static _Atomic uint64_t epoch_source;

/* Table of each kind, and its name for users. */
static const char *const kind_table[DSPK__CACHE_NKINDS] = {"kernels",
                                                           "autotune", "blobs"};

/* ---- schema and migrations ---------------------------------------------- */

/* migrations[i] brings user_version i to i+1.  Append only; never edit a
 * released step.  The key hash (hash.c) is part of the format too. */
static const char *const migrations[] = {
    /* 0 -> 1 */
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
    "CREATE INDEX blobs_tick ON blobs(tick);",
};
#define SCHEMA_VERSION ((int)(sizeof migrations / sizeof migrations[0]))

/* ---- small helpers ---------------------------------------------------------- */

static int map_rc(int rc) {
  switch (rc & 0xff) {
  case SQLITE_OK:
  case SQLITE_ROW:
  case SQLITE_DONE:
    return 0;
  case SQLITE_NOMEM:
    return DSPK_ENOMEM;
  case SQLITE_BUSY:
  case SQLITE_LOCKED:
    return DSPK_EBUSY;
  case SQLITE_TOOBIG:
    return DSPK_ELIMIT;
  case SQLITE_MISUSE:
  case SQLITE_RANGE:
    return DSPK_EINTERNAL;
  default:
    return DSPK_EIO;
  }
}

static int is_corrupt_rc(int rc) {
  rc &= 0xff;
  return rc == SQLITE_CORRUPT || rc == SQLITE_NOTADB;
}

static void setwarn(char *warn, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void setwarn(char *warn, size_t len, const char *fmt, ...) {
  va_list ap;
  if (!warn || !len)
    return;
  va_start(ap, fmt);
  vsnprintf(warn, len, fmt, ap);
  va_end(ap);
}

static int64_t now_s(void) { return (int64_t)time(NULL); }

/* Runs one statement that returns no rows we need.  Returns an sqlite rc. */
static int exec(sqlite3 *db, const char *sql) {
  return sqlite3_exec(db, sql, NULL, NULL, NULL);
}

static int begin_write(sqlite3 *db) { return exec(db, "BEGIN IMMEDIATE"); }

static void rollback(sqlite3 *db) {
  if (!sqlite3_get_autocommit(db))
    exec(db, "ROLLBACK");
}

/* Binds a possibly NULL string (NULL binds SQL NULL, which `IS` matches). */
static int bind_str(sqlite3_stmt *st, int i, const char *s) {
  if (!s)
    return sqlite3_bind_null(st, i);
  return sqlite3_bind_text(st, i, s, -1, SQLITE_STATIC);
}

/* The device's five fields (backend, name, arch, uuid, driver) as
 * parameters first..first+4. */
static void bind_dev(sqlite3_stmt *st, int first, const struct dspk__cache_devid *d) {
  const char *v[5] = {d->backend, d->name, d->arch, d->uuid, d->driver};
  for (int i = 0; i < 5; i++)
    bind_str(st, first + i, v[i]);
}

static size_t slen(const char *s) { return s ? strlen(s) : 0; }

/* Creates every missing directory above path (mode 0700).  Returns 0 or
 * -errno. */
static int mkdirs_for(const char *path) {
  char *dup = strdup(path);
  int rc = 0;
  if (!dup)
    return -ENOMEM;
  char *slash = strrchr(dup, '/');
  if (!slash || slash == dup)
    goto out;
  *slash = '\0';
  for (char *p = dup + 1; *p; p++) {
    if (*p != '/')
      continue;
    *p = '\0';
    if (mkdir(dup, 0700) != 0 && errno != EEXIST) {
      rc = -errno;
      goto out;
    }
    *p = '/';
  }
  if (mkdir(dup, 0700) != 0 && errno != EEXIST)
    rc = -errno;
out:
  free(dup);
  return rc;
}

/* Returns the default cache path (malloc'd) or NULL when no home is known. */
static char *default_path(void) {
  const char *xdg = getenv("XDG_CACHE_HOME");
  const char *home = getenv("HOME");
  char *out = NULL;
  if (xdg && xdg[0] == '/') {
    if (asprintf(&out, "%s/dspk/cache.db", xdg) < 0)
      return NULL;
    return out;
  }
  if (!home || !home[0]) {
    struct passwd *pw = getpwuid(getuid());
    home = pw ? pw->pw_dir : NULL;
  }
  if (!home || !home[0])
    return NULL;
  if (asprintf(&out, "%s/.cache/dspk/cache.db", home) < 0)
    return NULL;
  return out;
}

/* ---- opening ------------------------------------------------------------- */

enum open_result { OPEN_OK, OPEN_CORRUPT, OPEN_UNWRITABLE, OPEN_NEWER,
                   OPEN_FAIL };

/* Applies migrations up to SCHEMA_VERSION inside one write transaction.
 * Returns an sqlite rc, or -1 when the file's schema is newer than ours. */
static int migrate(sqlite3 *db) {
  int rc = begin_write(db);
  if (rc != SQLITE_OK)
    return rc;
  sqlite3_stmt *st = NULL;
  rc = sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, NULL);
  if (rc != SQLITE_OK)
    goto fail;
  rc = sqlite3_step(st);
  if (rc != SQLITE_ROW)
    goto fail;
  int v = sqlite3_column_int(st, 0);
  sqlite3_finalize(st);
  st = NULL;
  if (v > SCHEMA_VERSION) {
    rollback(db);
    return -1;
  }
  for (; v < SCHEMA_VERSION; v++) {
    rc = exec(db, migrations[v]);
    if (rc != SQLITE_OK)
      goto fail;
  }
  char sql[64];
  snprintf(sql, sizeof sql, "PRAGMA user_version=%d", SCHEMA_VERSION);
  rc = exec(db, sql);
  if (rc != SQLITE_OK)
    goto fail;
  return exec(db, "COMMIT");
fail:
  sqlite3_finalize(st);
  rollback(db);
  return rc;
}

/* Runs PRAGMA quick_check.  Returns SQLITE_OK when it says "ok",
 * SQLITE_CORRUPT when it lists problems, or the rc of the failure. */
static int quick_check(sqlite3 *db, char *detail, size_t len) {
  sqlite3_stmt *st = NULL;
  int rc = sqlite3_prepare_v2(db, "PRAGMA quick_check(1)", -1, &st, NULL);
  if (rc != SQLITE_OK)
    return rc;
  rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) {
    const char *r = (const char *)sqlite3_column_text(st, 0);
    if (r && strcmp(r, "ok") == 0) {
      rc = SQLITE_OK;
    } else {
      if (detail && len)
        snprintf(detail, len, "%s", r ? r : "quick_check failed");
      rc = SQLITE_CORRUPT;
    }
  }
  sqlite3_finalize(st);
  return rc;
}

/* Opens path and makes it ready (WAL, busy timeout, check, schema).  On
 * OPEN_OK writes *out; otherwise closes what it opened and explains in why. */
static enum open_result try_open(const char *path, int busy_ms, sqlite3 **out,
                                 char *why, size_t whylen) {
  sqlite3 *db = NULL;
  int mem = strcmp(path, ":memory:") == 0;
  int rc = sqlite3_open_v2(path, &db,
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE |
                               SQLITE_OPEN_NOMUTEX,
                           NULL);
  enum open_result res = OPEN_FAIL;
  if (rc != SQLITE_OK) {
    snprintf(why, whylen, "%s", db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
    res = (rc & 0xff) == SQLITE_CANTOPEN || (rc & 0xff) == SQLITE_PERM ||
                  (rc & 0xff) == SQLITE_READONLY
              ? OPEN_UNWRITABLE
              : OPEN_FAIL;
    goto fail;
  }
  sqlite3_extended_result_codes(db, 1);
  sqlite3_busy_timeout(db, busy_ms);
  if (sqlite3_db_readonly(db, "main") == 1) {
    snprintf(why, whylen, "the file is read-only");
    res = OPEN_UNWRITABLE;
    goto fail;
  }
  /* Integrity first: a file that is not a database fails here. */
  rc = quick_check(db, why, whylen);
  if (rc != SQLITE_OK) {
    if (is_corrupt_rc(rc)) {
      if (rc != SQLITE_CORRUPT || !why[0])
        snprintf(why, whylen, "%s", sqlite3_errstr(rc));
      res = OPEN_CORRUPT;
    } else {
      snprintf(why, whylen, "%s", sqlite3_errmsg(db));
    }
    goto fail;
  }
  if (!mem) {
    /* auto_vacuum only takes effect on a new, empty file; it lets clear()
     * give pages back to the file system. */
    exec(db, "PRAGMA auto_vacuum=INCREMENTAL");
    sqlite3_stmt *st = NULL;
    rc = sqlite3_prepare_v2(db, "PRAGMA journal_mode=WAL", -1, &st, NULL);
    if (rc == SQLITE_OK) {
      rc = sqlite3_step(st);
      if (rc == SQLITE_ROW) {
        const char *m = (const char *)sqlite3_column_text(st, 0);
        rc = m && strcmp(m, "wal") == 0 ? SQLITE_OK : SQLITE_CANTOPEN;
      }
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_OK) {
      snprintf(why, whylen, "cannot enable WAL: %s", sqlite3_errstr(rc));
      res = is_corrupt_rc(rc) ? OPEN_CORRUPT
            : ((rc & 0xff) == SQLITE_READONLY ||
               (rc & 0xff) == SQLITE_CANTOPEN || (rc & 0xff) == SQLITE_IOERR)
                ? OPEN_UNWRITABLE
                : OPEN_FAIL;
      goto fail;
    }
    /* In WAL mode NORMAL keeps the file consistent across a process crash;
     * only a power loss may drop the last commits, which a cache tolerates. */
    exec(db, "PRAGMA synchronous=NORMAL");
  }
  rc = migrate(db);
  if (rc == -1) {
    snprintf(why, whylen, "its schema is newer than this build's (%d)",
             SCHEMA_VERSION);
    res = OPEN_NEWER;
    goto fail;
  }
  if (rc != SQLITE_OK) {
    snprintf(why, whylen, "%s", sqlite3_errstr(rc));
    res = is_corrupt_rc(rc) ? OPEN_CORRUPT
          : ((rc & 0xff) == SQLITE_READONLY || (rc & 0xff) == SQLITE_IOERR ||
             (rc & 0xff) == SQLITE_CANTOPEN)
              ? OPEN_UNWRITABLE
              : OPEN_FAIL;
    goto fail;
  }
  *out = db;
  return OPEN_OK;
fail:
  sqlite3_close_v2(db);
  return res;
}

/* Renames path and its -wal/-shm companions to "<name>.corrupt-<time>".
 * Writes the new main name into moved.  Returns 0 or -errno. */
static int move_aside(const char *path, char *moved, size_t len) {
  static const char *const suffix[] = {"", "-wal", "-shm"};
  long t = (long)now_s();
  snprintf(moved, len, "%s.corrupt-%ld", path, t);
  for (size_t i = 0; i < 3; i++) {
    char from[4096], to[4200];
    snprintf(from, sizeof from, "%s%s", path, suffix[i]);
    snprintf(to, sizeof to, "%s.corrupt-%ld%s", path, t, suffix[i]);
    if (rename(from, to) != 0 && errno != ENOENT) {
      if (i == 0)
        return -errno;
      unlink(from); /* a companion of a corrupt file is useless */
    }
  }
  return 0;
}

/* See cache.h. */
int dspk__cache_open(const char *path, const struct dspk__cache_opts *opts,
                     struct dspk__cache **out, char *warn, size_t warnlen) {
  struct dspk__cache *c = NULL;
  sqlite3 *db = NULL;
  char why[512] = "", moved[4200];
  int busy_ms = opts && opts->busy_timeout_ms > 0 ? opts->busy_timeout_ms
                                                  : DEFAULT_BUSY_MS;
  int no_fallback = opts && opts->no_fallback;
  int err;

  if (warn && warnlen)
    warn[0] = '\0';
  c = calloc(1, sizeof *c);
  if (!c)
    return DSPK_ENOMEM;
  c->max_bytes = opts && opts->max_bytes ? opts->max_bytes : DEFAULT_MAX_BYTES;
  c->path = path ? strdup(path) : default_path();
  if (!c->path) {
    if (path) {
      err = DSPK_ENOMEM;
      goto err_free;
    }
    snprintf(why, sizeof why, "no home directory to hold it");
    goto fallback;
  }
  if (strcmp(c->path, ":memory:") == 0) {
    if (try_open(":memory:", busy_ms, &db, why, sizeof why) != OPEN_OK) {
      err = DSPK_EIO;
      goto err_free;
    }
    c->in_memory = 1;
    goto ready;
  }
  int mk = mkdirs_for(c->path);
  if (mk < 0) {
    snprintf(why, sizeof why, "cannot create its directory: %s",
             strerror(-mk));
    goto fallback;
  }
  switch (try_open(c->path, busy_ms, &db, why, sizeof why)) {
  case OPEN_OK:
    goto ready;
  case OPEN_CORRUPT: {
    char first[256];
    snprintf(first, sizeof first, "%.200s", why);
    if (no_fallback) {
      err = DSPK_EIO;
      goto err_free;
    }
    int mv = move_aside(c->path, moved, sizeof moved);
    if (mv < 0) {
      snprintf(why, sizeof why, "corrupt (%s) and cannot be moved aside: %s",
               first, strerror(-mv));
      goto fallback;
    }
    if (try_open(c->path, busy_ms, &db, why, sizeof why) != OPEN_OK)
      goto fallback;
    setwarn(warn, warnlen,
            "cache file %s was corrupt (%s); moved it to %s and rebuilt it",
            c->path, first, moved);
    goto ready;
  }
  default:
    goto fallback;
  }

fallback:
  if (no_fallback) {
    err = DSPK_EIO;
    goto err_free;
  }
  if (try_open(":memory:", busy_ms, &db, why, sizeof why) != OPEN_OK) {
    err = DSPK_EIO;
    goto err_free;
  }
  setwarn(warn, warnlen,
          "cache file %s is unusable (%s); using an in-memory cache",
          c->path ? c->path : "(default)", why);
  free(c->path);
  c->path = strdup(":memory:");
  if (!c->path) {
    err = DSPK_ENOMEM;
    goto err_db;
  }
  c->in_memory = 1;

ready:
  if (pthread_mutex_init(&c->mu, NULL) != 0) {
    err = DSPK_ENOMEM;
    goto err_db;
  }
  c->db = db;
  atomic_store(&c->epoch, atomic_fetch_add(&epoch_source, 1) + 1);
  *out = c;
  return 0;

err_db:
  sqlite3_close_v2(db);
err_free:
  free(c->path);
  free(c);
  return err;
}

/* See cache.h. */
void dspk__cache_close(struct dspk__cache *c) {
  if (!c)
    return;
  sqlite3_close_v2(c->db);
  pthread_mutex_destroy(&c->mu);
  free(c->path);
  free(c);
}

/* See cache.h. */
const char *dspk__cache_path(const struct dspk__cache *c) { return c->path; }

/* See cache.h. */
int dspk__cache_in_memory(const struct dspk__cache *c) { return c->in_memory; }

/* See cache.h. */
const char *dspk__cache_kind_name(int kind) {
  if (kind < 0 || kind >= DSPK__CACHE_NKINDS)
    return NULL;
  return kind_table[kind];
}

/* See cache.h. */
int dspk__cache_kind_from_name(const char *name, size_t len) {
  for (int k = 0; name && k < DSPK__CACHE_NKINDS; k++)
    if (strlen(kind_table[k]) == len && memcmp(kind_table[k], name, len) == 0)
      return k;
  return DSPK_EINVAL;
}

/* ---- recency, size bound -------------------------------------------------- */

/* Bumps the logical clock (inside a write transaction) and returns the new
 * tick, or a negative sqlite rc. */
static int64_t next_tick(sqlite3 *db) {
  sqlite3_stmt *st = NULL;
  int64_t t;
  int rc = sqlite3_prepare_v2(
      db, "UPDATE meta SET v = v + 1 WHERE k = 'tick' RETURNING v", -1, &st,
      NULL);
  if (rc != SQLITE_OK)
    return -rc;
  rc = sqlite3_step(st);
  t = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -(rc ? rc : 1);
  sqlite3_finalize(st);
  return t;
}

/* Records a hit on the entry of table `kind` whose key column equals key:
 * hits+1, last_used, tick.  Best effort: a busy file only loses recency. */
static void touch(struct dspk__cache *c, int kind, const char *key) {
  static const char *const sql[DSPK__CACHE_NKINDS] = {
      "UPDATE kernels SET hits = hits + 1, last_used = ?1, tick = ?2"
      " WHERE key = ?3",
      "UPDATE autotune SET hits = hits + 1, last_used = ?1, tick = ?2"
      " WHERE key = ?3",
      "UPDATE blobs SET hits = hits + 1, last_used = ?1, tick = ?2"
      " WHERE name = ?3"};
  sqlite3_stmt *st = NULL;
  if (begin_write(c->db) != SQLITE_OK)
    return;
  int64_t t = next_tick(c->db);
  if (t < 0)
    goto out;
  if (sqlite3_prepare_v2(c->db, sql[kind], -1, &st, NULL) != SQLITE_OK)
    goto out;
  sqlite3_bind_int64(st, 1, now_s());
  sqlite3_bind_int64(st, 2, t);
  sqlite3_bind_text(st, 3, key, -1, SQLITE_STATIC);
  if (sqlite3_step(st) == SQLITE_DONE) {
    sqlite3_finalize(st);
    st = NULL;
    if (exec(c->db, "COMMIT") == SQLITE_OK)
      return;
  }
out:
  sqlite3_finalize(st);
  rollback(c->db);
}

/* Deletes least recently used entries (inside the caller's write
 * transaction) until the total size is at most max_bytes.  Returns an
 * sqlite rc. */
static int evict(struct dspk__cache *c) {
  sqlite3_stmt *tot = NULL, *old = NULL, *del[DSPK__CACHE_NKINDS] = {0};
  static const char *const del_sql[DSPK__CACHE_NKINDS] = {
      "DELETE FROM kernels WHERE rowid = ?1",
      "DELETE FROM autotune WHERE rowid = ?1",
      "DELETE FROM blobs WHERE rowid = ?1"};
  int rc = sqlite3_prepare_v2(
      c->db,
      "SELECT (SELECT total(size) FROM kernels) + (SELECT total(size) FROM"
      " autotune) + (SELECT total(size) FROM blobs)",
      -1, &tot, NULL);
  if (rc != SQLITE_OK)
    goto out;
  rc = sqlite3_step(tot);
  if (rc != SQLITE_ROW)
    goto out;
  double total = sqlite3_column_double(tot, 0);
  rc = SQLITE_OK;
  if (total <= (double)c->max_bytes)
    goto out;
  rc = sqlite3_prepare_v2(
      c->db,
      "SELECT 0, rowid, size, tick FROM kernels UNION ALL"
      " SELECT 1, rowid, size, tick FROM autotune UNION ALL"
      " SELECT 2, rowid, size, tick FROM blobs ORDER BY 4 LIMIT 64",
      -1, &old, NULL);
  if (rc != SQLITE_OK)
    goto out;
  for (int k = 0; k < DSPK__CACHE_NKINDS; k++) {
    rc = sqlite3_prepare_v2(c->db, del_sql[k], -1, &del[k], NULL);
    if (rc != SQLITE_OK)
      goto out;
  }
  while (total > (double)c->max_bytes) {
    int64_t victims[64][2];
    double sizes[64];
    int n = 0;
    sqlite3_reset(old);
    while ((rc = sqlite3_step(old)) == SQLITE_ROW && n < 64) {
      victims[n][0] = sqlite3_column_int64(old, 0);
      victims[n][1] = sqlite3_column_int64(old, 1);
      sizes[n] = sqlite3_column_double(old, 2);
      n++;
    }
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
      goto out;
    rc = SQLITE_OK;
    if (n == 0)
      break;
    /* The reader is reset before deleting, so no cursor is open on the
     * rows being removed. */
    sqlite3_reset(old);
    for (int i = 0; i < n && total > (double)c->max_bytes; i++) {
      sqlite3_stmt *d = del[victims[i][0]];
      sqlite3_reset(d);
      sqlite3_bind_int64(d, 1, victims[i][1]);
      rc = sqlite3_step(d);
      if (rc != SQLITE_DONE)
        goto out;
      rc = SQLITE_OK;
      total -= sizes[i];
      c->count[victims[i][0]].evictions++;
    }
  }
out:
  sqlite3_finalize(tot);
  sqlite3_finalize(old);
  for (int k = 0; k < DSPK__CACHE_NKINDS; k++)
    sqlite3_finalize(del[k]);
  return rc;
}

/* Finishes a put: runs the prepared insert (whose ?2 is the tick) inside a
 * write transaction together with the tick bump and the eviction.  Takes
 * ownership of st.  Called with the mutex held.  Returns 0 or a dspk_errno. */
static int put_commit(struct dspk__cache *c, int kind, sqlite3_stmt *st,
                      int tick_param) {
  int rc = begin_write(c->db);
  if (rc != SQLITE_OK)
    goto out;
  int64_t t = next_tick(c->db);
  if (t < 0) {
    rc = (int)-t;
    goto out;
  }
  sqlite3_bind_int64(st, tick_param, t);
  rc = sqlite3_step(st);
  if (rc != SQLITE_DONE)
    goto out;
  rc = evict(c);
  if (rc != SQLITE_OK)
    goto out;
  rc = exec(c->db, "COMMIT");
  if (rc == SQLITE_OK)
    c->count[kind].puts++;
out:
  sqlite3_finalize(st);
  if (rc != SQLITE_OK && rc != SQLITE_DONE)
    rollback(c->db);
  return map_rc(rc);
}

/* ---- keys ------------------------------------------------------------------- */

static void hash_dev(struct dspk__hash *h, const struct dspk__cache_devid *d) {
  dspk__hash_str(h, d->backend);
  dspk__hash_str(h, d->name);
  dspk__hash_str(h, d->arch);
  dspk__hash_str(h, d->uuid);
  dspk__hash_str(h, d->driver);
}

static size_t dev_len(const struct dspk__cache_devid *d) {
  return slen(d->backend) + slen(d->name) + slen(d->arch) + slen(d->uuid) +
         slen(d->driver);
}

struct kkey {
  char key[DSPK__HASH_HEX];
  char src[DSPK__HASH_HEX];
};

static void kernel_key(const struct dspk__kernel_key *k, struct kkey *out) {
  struct dspk__hash h;
  dspk__hash_init(&h);
  dspk__hash_field(&h, k->source, k->source_len);
  dspk__hash_hex(&h, out->src);
  dspk__hash_init(&h);
  dspk__hash_str(&h, "kernel/1");
  hash_dev(&h, &k->dev);
  dspk__hash_str(&h, k->compiler);
  dspk__hash_str(&h, k->compiler_version);
  dspk__hash_str(&h, k->name);
  dspk__hash_field(&h, k->source, k->source_len);
  dspk__hash_str(&h, k->options);
  dspk__hash_hex(&h, out->key);
}

static void tune_key(const struct dspk__tune_key *k, char key[DSPK__HASH_HEX],
                     char cands[17]) {
  struct dspk__hash h;
  dspk__hash_init(&h);
  dspk__hash_str(&h, "autotune/1");
  hash_dev(&h, &k->dev);
  dspk__hash_str(&h, k->op);
  dspk__hash_str(&h, k->shape);
  dspk__hash_str(&h, k->dtypes);
  dspk__hash_str(&h, k->layout);
  dspk__hash_u64(&h, k->cands_hash);
  dspk__hash_hex(&h, key);
  snprintf(cands, 17, "%016llx", (unsigned long long)k->cands_hash);
}

/* ---- compiled kernels ---------------------------------------------------- */

/* Shared by get and put: the WHERE clause compares every stored field, so a
 * hash collision can only be a miss. */
#define KERNEL_MATCH                                                           \
  " key = ?1 AND backend IS ?2 AND device IS ?3 AND arch IS ?4 AND"            \
  " uuid IS ?5 AND driver IS ?6 AND compiler IS ?7 AND"                        \
  " compiler_version IS ?8 AND name IS ?9 AND source_hash = ?10 AND"           \
  " options IS ?11"

static void bind_kernel(sqlite3_stmt *st, const struct dspk__kernel_key *k,
                        const struct kkey *kk) {
  sqlite3_bind_text(st, 1, kk->key, -1, SQLITE_STATIC);
  bind_dev(st, 2, &k->dev);
  bind_str(st, 7, k->compiler);
  bind_str(st, 8, k->compiler_version);
  bind_str(st, 9, k->name);
  sqlite3_bind_text(st, 10, kk->src, -1, SQLITE_STATIC);
  bind_str(st, 11, k->options);
}

/* Reads one blob column of a single-row query into a malloc'd copy.
 * Returns 0, DSPK_ENOENT when there is no row, or a dspk_errno. */
static int fetch_blob(sqlite3_stmt *st, void **data, size_t *len) {
  int rc = sqlite3_step(st);
  if (rc == SQLITE_DONE)
    return DSPK_ENOENT;
  if (rc != SQLITE_ROW)
    return map_rc(rc);
  const void *p = sqlite3_column_blob(st, 0);
  size_t n = (size_t)sqlite3_column_bytes(st, 0);
  void *copy = malloc(n ? n : 1);
  if (!copy)
    return DSPK_ENOMEM;
  if (n)
    memcpy(copy, p, n);
  *data = copy;
  *len = n;
  return 0;
}

/* See cache.h. */
int dspk__cache_kernel_get(struct dspk__cache *c,
                           const struct dspk__kernel_key *k, void **bin,
                           size_t *len) {
  struct kkey kk;
  sqlite3_stmt *st = NULL;
  int err;
  if (!c || !k || !bin || !len || (!k->source && k->source_len))
    return DSPK_EINVAL;
  kernel_key(k, &kk);
  pthread_mutex_lock(&c->mu);
  int rc = sqlite3_prepare_v2(c->db, "SELECT bin FROM kernels WHERE"
                              KERNEL_MATCH, -1, &st, NULL);
  if (rc != SQLITE_OK) {
    err = map_rc(rc);
    goto out;
  }
  bind_kernel(st, k, &kk);
  err = fetch_blob(st, bin, len);
  sqlite3_finalize(st);
  st = NULL;
  if (err == 0) {
    c->count[DSPK__CACHE_KERNELS].hits++;
    touch(c, DSPK__CACHE_KERNELS, kk.key);
  } else if (err == DSPK_ENOENT) {
    c->count[DSPK__CACHE_KERNELS].misses++;
  }
out:
  sqlite3_finalize(st);
  pthread_mutex_unlock(&c->mu);
  return err;
}

/* See cache.h. */
int dspk__cache_kernel_put(struct dspk__cache *c,
                           const struct dspk__kernel_key *k, const void *bin,
                           size_t len) {
  struct kkey kk;
  sqlite3_stmt *st = NULL;
  int err;
  if (!c || !k || (!bin && len) || (!k->source && k->source_len))
    return DSPK_EINVAL;
  kernel_key(k, &kk);
  uint64_t size = len + dev_len(&k->dev) + slen(k->compiler) +
                  slen(k->compiler_version) + slen(k->name) +
                  slen(k->options) + 2 * 32;
  if (size > c->max_bytes)
    return DSPK_ELIMIT;
  pthread_mutex_lock(&c->mu);
  int rc = sqlite3_prepare_v2(
      c->db,
      "INSERT OR REPLACE INTO kernels(key, tick, backend, device, arch, uuid,"
      " driver, compiler, compiler_version, name, source_hash, options, bin,"
      " size, created, last_used, hits)"
      " VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14,"
      " ?15, ?15, 0)",
      -1, &st, NULL);
  if (rc != SQLITE_OK) {
    err = map_rc(rc);
    goto out;
  }
  sqlite3_bind_text(st, 1, kk.key, -1, SQLITE_STATIC);
  bind_dev(st, 3, &k->dev);
  bind_str(st, 8, k->compiler);
  bind_str(st, 9, k->compiler_version);
  bind_str(st, 10, k->name);
  sqlite3_bind_text(st, 11, kk.src, -1, SQLITE_STATIC);
  bind_str(st, 12, k->options);
  sqlite3_bind_blob64(st, 13, len ? bin : "", len, SQLITE_STATIC);
  sqlite3_bind_int64(st, 14, (int64_t)size);
  sqlite3_bind_int64(st, 15, now_s());
  err = put_commit(c, DSPK__CACHE_KERNELS, st, 2);
out:
  pthread_mutex_unlock(&c->mu);
  return err;
}

/* ---- autotune decisions -------------------------------------------------- */

#define TUNE_MATCH                                                             \
  " key = ?1 AND backend IS ?2 AND device IS ?3 AND arch IS ?4 AND"            \
  " uuid IS ?5 AND driver IS ?6 AND op IS ?7 AND shape IS ?8 AND"              \
  " dtypes IS ?9 AND layout IS ?10 AND cands_hash = ?11"

static void bind_tune(sqlite3_stmt *st, const struct dspk__tune_key *k,
                      const char *key, const char *cands) {
  sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
  bind_dev(st, 2, &k->dev);
  bind_str(st, 7, k->op);
  bind_str(st, 8, k->shape);
  bind_str(st, 9, k->dtypes);
  bind_str(st, 10, k->layout);
  sqlite3_bind_text(st, 11, cands, -1, SQLITE_STATIC);
}

/* Looks up column col of the matching decision and copies it into buf.
 * trunc: 1 truncates a long value, 0 fails with DSPK_ERANGE.  count: 1
 * counts the hit or miss.  Called without the mutex. */
static int tune_lookup(struct dspk__cache *c, const struct dspk__tune_key *k,
                       const char *col, char *buf, size_t len, int trunc,
                       int count) {
  char key[DSPK__HASH_HEX], cands[17], sql[512];
  sqlite3_stmt *st = NULL;
  int err;
  if (!c || !k || !buf || !len)
    return DSPK_EINVAL;
  tune_key(k, key, cands);
  snprintf(sql, sizeof sql, "SELECT %s FROM autotune WHERE" TUNE_MATCH, col);
  pthread_mutex_lock(&c->mu);
  int rc = sqlite3_prepare_v2(c->db, sql, -1, &st, NULL);
  if (rc != SQLITE_OK) {
    err = map_rc(rc);
    goto out;
  }
  bind_tune(st, k, key, cands);
  rc = sqlite3_step(st);
  if (rc == SQLITE_DONE) {
    err = DSPK_ENOENT;
    if (count)
      c->count[DSPK__CACHE_AUTOTUNE].misses++;
    goto out;
  }
  if (rc != SQLITE_ROW) {
    err = map_rc(rc);
    goto out;
  }
  const char *v = (const char *)sqlite3_column_text(st, 0);
  size_t n = (size_t)sqlite3_column_bytes(st, 0);
  if (n >= len && !trunc) {
    err = DSPK_ERANGE;
    goto out;
  }
  if (n >= len)
    n = len - 1;
  if (n)
    memcpy(buf, v, n);
  buf[n] = '\0';
  err = 0;
  sqlite3_finalize(st);
  st = NULL;
  if (count) {
    c->count[DSPK__CACHE_AUTOTUNE].hits++;
    touch(c, DSPK__CACHE_AUTOTUNE, key);
  }
out:
  sqlite3_finalize(st);
  pthread_mutex_unlock(&c->mu);
  return err;
}

/* See cache.h. */
int dspk__cache_tune_get(struct dspk__cache *c, const struct dspk__tune_key *k,
                         char *winner, size_t len) {
  return tune_lookup(c, k, "winner", winner, len, 0, 1);
}

/* See cache.h. */
int dspk__cache_tune_timings(struct dspk__cache *c,
                             const struct dspk__tune_key *k, char *buf,
                             size_t len) {
  return tune_lookup(c, k, "coalesce(timings, '')", buf, len, 1, 0);
}

/* See cache.h. */
int dspk__cache_tune_put(struct dspk__cache *c, const struct dspk__tune_key *k,
                         const char *winner, const char *timings) {
  char key[DSPK__HASH_HEX], cands[17];
  sqlite3_stmt *st = NULL;
  int err;
  if (!c || !k || !winner)
    return DSPK_EINVAL;
  tune_key(k, key, cands);
  uint64_t size = dev_len(&k->dev) + slen(k->op) + slen(k->shape) +
                  slen(k->dtypes) + slen(k->layout) + slen(winner) +
                  slen(timings) + 32 + 16;
  if (size > c->max_bytes)
    return DSPK_ELIMIT;
  pthread_mutex_lock(&c->mu);
  int rc = sqlite3_prepare_v2(
      c->db,
      "INSERT OR REPLACE INTO autotune(key, tick, backend, device, arch, uuid,"
      " driver, op, shape, dtypes, layout, cands_hash, winner, timings, size,"
      " created, last_used, hits)"
      " VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14,"
      " ?15, ?16, ?16, 0)",
      -1, &st, NULL);
  if (rc != SQLITE_OK) {
    err = map_rc(rc);
    goto out;
  }
  sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
  bind_dev(st, 3, &k->dev);
  bind_str(st, 8, k->op);
  bind_str(st, 9, k->shape);
  bind_str(st, 10, k->dtypes);
  bind_str(st, 11, k->layout);
  sqlite3_bind_text(st, 12, cands, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 13, winner, -1, SQLITE_STATIC);
  bind_str(st, 14, timings);
  sqlite3_bind_int64(st, 15, (int64_t)size);
  sqlite3_bind_int64(st, 16, now_s());
  err = put_commit(c, DSPK__CACHE_AUTOTUNE, st, 2);
out:
  pthread_mutex_unlock(&c->mu);
  return err;
}

/* See cache.h. */
int dspk__cache_tune_del(struct dspk__cache *c,
                         const struct dspk__tune_key *k) {
  char key[DSPK__HASH_HEX], cands[17];
  sqlite3_stmt *st = NULL;
  if (!c || !k)
    return DSPK_EINVAL;
  tune_key(k, key, cands);
  pthread_mutex_lock(&c->mu);
  /* The key alone identifies the row; deleting a colliding row would only
   * cost a re-tune. */
  int rc = sqlite3_prepare_v2(c->db, "DELETE FROM autotune WHERE key = ?1",
                              -1, &st, NULL);
  if (rc == SQLITE_OK) {
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    rc = sqlite3_step(st);
  }
  sqlite3_finalize(st);
  pthread_mutex_unlock(&c->mu);
  return map_rc(rc);
}

/* ---- named blobs ------------------------------------------------------------ */

/* See cache.h. */
int dspk__cache_blob_get(struct dspk__cache *c, const char *name, void **data,
                         size_t *len) {
  sqlite3_stmt *st = NULL;
  int err;
  if (!c || !name || !data || !len)
    return DSPK_EINVAL;
  pthread_mutex_lock(&c->mu);
  int rc = sqlite3_prepare_v2(c->db, "SELECT data FROM blobs WHERE name = ?1",
                              -1, &st, NULL);
  if (rc != SQLITE_OK) {
    err = map_rc(rc);
    goto out;
  }
  sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
  err = fetch_blob(st, data, len);
  sqlite3_finalize(st);
  st = NULL;
  if (err == 0) {
    c->count[DSPK__CACHE_BLOBS].hits++;
    touch(c, DSPK__CACHE_BLOBS, name);
  } else if (err == DSPK_ENOENT) {
    c->count[DSPK__CACHE_BLOBS].misses++;
  }
out:
  sqlite3_finalize(st);
  pthread_mutex_unlock(&c->mu);
  return err;
}

/* See cache.h. */
int dspk__cache_blob_put(struct dspk__cache *c, const char *name,
                         const void *data, size_t len) {
  sqlite3_stmt *st = NULL;
  int err;
  if (!c || !name || (!data && len))
    return DSPK_EINVAL;
  uint64_t size = len + strlen(name);
  if (size > c->max_bytes)
    return DSPK_ELIMIT;
  pthread_mutex_lock(&c->mu);
  int rc = sqlite3_prepare_v2(
      c->db,
      "INSERT OR REPLACE INTO blobs(name, tick, data, size, created,"
      " last_used, hits) VALUES(?1, ?2, ?3, ?4, ?5, ?5, 0)",
      -1, &st, NULL);
  if (rc != SQLITE_OK) {
    err = map_rc(rc);
    goto out;
  }
  sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
  sqlite3_bind_blob64(st, 3, len ? data : "", len, SQLITE_STATIC);
  sqlite3_bind_int64(st, 4, (int64_t)size);
  sqlite3_bind_int64(st, 5, now_s());
  err = put_commit(c, DSPK__CACHE_BLOBS, st, 2);
out:
  pthread_mutex_unlock(&c->mu);
  return err;
}

/* ---- stats and maintenance ------------------------------------------------ */

/* See cache.h. */
int dspk__cache_stats(struct dspk__cache *c, struct dspk__cache_stats *out) {
  struct dspk__cache_stats s;
  sqlite3_stmt *st = NULL;
  int rc = SQLITE_OK;
  if (!c || !out)
    return DSPK_EINVAL;
  memset(&s, 0, sizeof s);
  pthread_mutex_lock(&c->mu);
  for (int k = 0; k < DSPK__CACHE_NKINDS; k++) {
    char sql[128];
    snprintf(sql, sizeof sql,
             "SELECT count(*), total(size), total(hits) FROM %s",
             kind_table[k]);
    rc = sqlite3_prepare_v2(c->db, sql, -1, &st, NULL);
    if (rc != SQLITE_OK)
      goto out;
    rc = sqlite3_step(st);
    if (rc != SQLITE_ROW)
      goto out;
    s.kind[k].entries = (uint64_t)sqlite3_column_int64(st, 0);
    s.kind[k].bytes = (uint64_t)sqlite3_column_double(st, 1);
    s.kind[k].stored_hits = (uint64_t)sqlite3_column_double(st, 2);
    s.kind[k].hits = c->count[k].hits;
    s.kind[k].misses = c->count[k].misses;
    s.kind[k].puts = c->count[k].puts;
    s.kind[k].evictions = c->count[k].evictions;
    sqlite3_finalize(st);
    st = NULL;
  }
  s.max_bytes = c->max_bytes;
  s.in_memory = c->in_memory;
  if (!c->in_memory) {
    struct stat sb;
    if (stat(c->path, &sb) == 0)
      s.file_bytes = (uint64_t)sb.st_size;
  }
  rc = SQLITE_OK;
out:
  sqlite3_finalize(st);
  pthread_mutex_unlock(&c->mu);
  if (rc == SQLITE_OK || rc == SQLITE_ROW)
    *out = s;
  return map_rc(rc);
}

/* See cache.h. */
int dspk__cache_clear(struct dspk__cache *c, unsigned mask) {
  int rc;
  if (!c || (mask & ~DSPK__CACHE_ALL))
    return DSPK_EINVAL;
  pthread_mutex_lock(&c->mu);
  rc = begin_write(c->db);
  if (rc != SQLITE_OK)
    goto out;
  for (int k = 0; k < DSPK__CACHE_NKINDS; k++) {
    if (!(mask & DSPK__CACHE_MASK(k)))
      continue;
    char sql[64];
    snprintf(sql, sizeof sql, "DELETE FROM %s", kind_table[k]);
    rc = exec(c->db, sql);
    if (rc != SQLITE_OK)
      goto out;
  }
  rc = exec(c->db, "COMMIT");
  if (rc == SQLITE_OK && (mask & DSPK__CACHE_MASK(DSPK__CACHE_AUTOTUNE)))
    atomic_store(&c->epoch, atomic_fetch_add(&epoch_source, 1) + 1);
  if (rc == SQLITE_OK)
    exec(c->db, "PRAGMA incremental_vacuum"); /* best effort */
out:
  if (rc != SQLITE_OK)
    rollback(c->db);
  pthread_mutex_unlock(&c->mu);
  return map_rc(rc);
}

/* See cache.h. */
int dspk__cache_check(struct dspk__cache *c) {
  if (!c)
    return DSPK_EINVAL;
  pthread_mutex_lock(&c->mu);
  int rc = quick_check(c->db, NULL, 0);
  pthread_mutex_unlock(&c->mu);
  return rc == SQLITE_OK ? 0 : (is_corrupt_rc(rc) ? DSPK_EIO : map_rc(rc));
}

/* See cache.h. */
uint64_t dspk__cache_epoch(const struct dspk__cache *c) {
  return c ? atomic_load(&((struct dspk__cache *)c)->epoch) : 0;
}

/* See cache.h. */
void dspk__cache_counts(struct dspk__cache *c, struct dspk__cache_kstats *out) {
  for (int k = 0; k < DSPK__CACHE_NKINDS; k++) {
    memset(&out[k], 0, sizeof out[k]);
    if (!c)
      continue;
    out[k].hits = atomic_load(&c->count[k].hits);
    out[k].misses = atomic_load(&c->count[k].misses);
    out[k].puts = atomic_load(&c->count[k].puts);
    out[k].evictions = atomic_load(&c->count[k].evictions);
  }
}

/* See cache.h. */
void dspk__cache_count_hit(struct dspk__cache *c, int kind) {
  if (!c || kind < 0 || kind >= DSPK__CACHE_NKINDS)
    return;
  pthread_mutex_lock(&c->mu);
  c->count[kind].hits++;
  pthread_mutex_unlock(&c->mu);
}
