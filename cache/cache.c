/*
 * The persistent cache over SQLite: opening (default location, directory
 * creation, deciding whether the file is a dspk cache before changing
 * anything in it, WAL, busy timeout, schema migrations, corruption
 * recovery, in-memory fallback, following the path when the file is
 * deleted or replaced while open), the three kinds of entry (compiled kernels, autotune
 * decisions, named blobs), least-recently-used eviction under a size bound,
 * stats and clearing.
 *
 * One connection behind one mutex serves every thread of the process; each
 * API call is one short transaction (BEGIN IMMEDIATE for writes, so that a
 * writer waits for the lock instead of failing on a lock upgrade; once
 * open, briefly: busy_wait gives a write up rather than hold a runner).
 * Recency is a logical clock (meta.tick, bumped by every put and every hit,
 * hits served from callers' memos of decisions, kernels and blobs included:
 * those are batched, see flush_used) rather than wall time, so the eviction
 * order is exact even for entries touched within the same microsecond, and
 * holds across processes sharing the file.  A file locked by another
 * process at open is retried at each put (retry_busy); a corrupt one is
 * moved aside under a name no other file has (move_aside).
 */
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include "cache/cache.h"

#define DEFAULT_MAX_BYTES (UINT64_C(256) << 20)
#define DEFAULT_BUSY_MS 5000
/* Distinct entries whose memo uses are kept before they are written. */
#define USED_MAX 64

/* Atomics, so dspk__cache_counts() reads them without the mutex, which a
 * statement may hold for as long as SQLite's busy timeout. */
struct kcount {
  _Atomic uint64_t hits, misses, puts, evictions, put_errors;
};

struct dspk__cache {
  pthread_mutex_t mu;
  sqlite3 *db;
  char *path; /* the file asked for (NULL: no default location) */
  _Atomic int in_memory;
  int busy_ms;  /* the wait for another process's lock at open */
  int write_ms; /* and once open (busy_wait), under mu */
  uint64_t wait_from_ms, backoff_until_ms; /* busy_wait's state, under mu */
  uint64_t max_bytes;
  /* The file that path named when it was opened (remember_file). */
  dev_t dev;
  ino_t ino;
  int have_id;
  /* Its write-ahead log and shared-memory index ("<path>-wal", "-shm") as
   * the open connection made them: once the main file is replaced, these
   * belong to the old file and must not be applied to the new one
   * (drop_side_files). */
  struct side_id {
    dev_t dev;
    ino_t ino;
    int have;
  } side[2];
  void (*notice)(void *ud, const char *line);
  void *notice_ud;
  void (*put_result)(void *ud, int kind, int err, const char *detail);
  void (*dropped)(void *ud, int kind, const char *what, const char *why);
  int put_failing; /* the last put failed (under mu) */
  /* The file was locked by another process at open (OPEN_BUSY): the cache
   * is in memory, and each put tries the file again (retry_busy). */
  int busy_retry;
  int put_rc;      /* SQLite's code of the last failed put (under mu) */
  char put_sys[320]; /* the system's reason under it (sys_reason), or "" */
  struct kcount count[DSPK__CACHE_NKINDS];
  _Atomic uint64_t epoch;
  /* Uses of entries served from a caller's in-process memo
   * (dspk__cache_tune_used, _kernel_used, _blob_used), not yet written: one
   * row per entry, in order of last use, written in one transaction by
   * flush_used (under mu). */
  struct used {
    int kind;
    char *key; /* malloc'd: the row's key (kernels, autotune) or name (blobs) */
    uint64_t hits;
    int64_t last_used;
  } used[USED_MAX];
  int nused;
};

static int flush_used(struct dspk__cache *c, int in_txn);

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
    /* 1 -> 2: a client's kernel names its owner ("uid 1000"; NULL: the
     * daemon's own), which version 1 kept only inside name ("raw for uid
     * 1000"), so that each owner's entries are evicted apart. */
    "ALTER TABLE kernels ADD COLUMN owner TEXT;"
    "UPDATE kernels SET owner = substr(name, instr(name, ' for ') + 5)"
    " WHERE instr(name, ' for ') > 0;"
    "CREATE INDEX kernels_owner ON kernels(owner, tick);",
    /* 2 -> 3: every entry's checksum (entry_sum: over its key and what it
     * holds), checked at each get, so that an entry damaged in the file is
     * dropped and made again instead of served.  The entries already there
     * get theirs from fill_sums, in the same transaction. */
    "ALTER TABLE kernels ADD COLUMN sum TEXT;"
    "ALTER TABLE autotune ADD COLUMN sum TEXT;"
    "ALTER TABLE blobs ADD COLUMN sum TEXT;",
};
#define SCHEMA_VERSION ((int)(sizeof migrations / sizeof migrations[0]))

/* PRAGMA application_id of every dspk cache ("DSPK"), set when the file is
 * made (or, for a cache made before caches were marked, when it is first
 * opened), so that a database of another program is never taken for one. */
#define APPLICATION_ID 0x4453504b

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

/* mkdir(dir, 0700) whatever the umask: mkdir(2) gives 0700 & ~umask (mode
 * 000 under umask 0777, a directory its own non-root user cannot use:
 * probe 22 E2), so a directory made here is given its mode again.  The
 * chmod is only for one this call made, and only while it is still a
 * directory of this user (lstat: never through a symbolic link put in
 * its place).  0, or -1 with errno (EEXIST: something is there). */
static int mkdir_0700(const char *dir) {
  struct stat sb;
  if (mkdir(dir, 0700) != 0)
    return -1;
  if (lstat(dir, &sb) == 0 && S_ISDIR(sb.st_mode) && sb.st_uid == geteuid() &&
      (sb.st_mode & 07777) != 0700)
    (void)chmod(dir, 0700); /* best effort: a failure leaves it narrower, never wider */
  return 0;
}

/* Creates every missing directory above path (mode 0700 whatever the
 * umask).  Returns 0 or -errno. */
static int mkdirs_for(const char *path, int *made) {
  char *dup = strdup(path);
  int rc = 0;
  *made = 0;
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
    if (mkdir_0700(dup) == 0) {
      (*made)++;
    } else if (errno != EEXIST) {
      rc = -errno;
      goto out;
    }
    *p = '/';
  }
  if (mkdir_0700(dup) == 0)
    (*made)++;
  else if (errno != EEXIST)
    rc = -errno;
out:
  free(dup);
  return rc;
}

/* Returns the default cache path (malloc'd) or NULL when no home is known.
 * A relative or empty $XDG_CACHE_HOME or $HOME is taken as unset (the XDG
 * Base Directory specification: a relative path is invalid): the path
 * would depend on the working directory, which a detached daemon changes
 * to / (outside probe 16 E2: HOME=rel made /rel/.cache/dspk/cache.db).
 * The fallback for $HOME is the passwd entry's home, when absolute. */
static char *default_path(void) {
  const char *xdg = getenv("XDG_CACHE_HOME");
  const char *home = getenv("HOME");
  char *out = NULL;
  if (xdg && xdg[0] == '/') {
    if (asprintf(&out, "%s/dspk/cache.db", xdg) < 0)
      return NULL;
    return out;
  }
  if (!home || home[0] != '/') {
    struct passwd *pw = getpwuid(getuid());
    home = pw ? pw->pw_dir : NULL;
  }
  if (!home || home[0] != '/')
    return NULL;
  if (asprintf(&out, "%s/.cache/dspk/cache.db", home) < 0)
    return NULL;
  return out;
}

/* After one write gave up waiting for another process's lock, the writes
 * of the next BACKOFF_MS try the lock once, without waiting. */
#define BACKOFF_MS 1000
#define DEFAULT_WRITE_MS 100

static uint64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* SQLite's busy handler of an open cache's connection (called with the
 * cache's mutex held, by the thread whose statement found another
 * process's lock; n: the calls before this one for that statement): waits
 * in steps of at most 5 ms, up to write_ms in all, and then gives up (the
 * statement fails with SQLITE_BUSY: a put is not kept, a hit's recency is
 * lost), and for BACKOFF_MS after that gives up at once.  So a lock that
 * another process holds for long (a long transaction, an sqlite3 session)
 * costs a runner at most write_ms per second, never the open's busy
 * timeout per put, and the cache's mutex, which every runner's lookups
 * take, is never held that long. */
static int busy_wait(void *ud, int n) {
  struct dspk__cache *c = ud;
  uint64_t now = mono_ms();
  if (n == 0) {
    if (now < c->backoff_until_ms)
      return 0;
    c->wait_from_ms = now;
  }
  if (now - c->wait_from_ms >= (uint64_t)c->write_ms) {
    c->backoff_until_ms = now + BACKOFF_MS;
    return 0;
  }
  uint64_t left = (uint64_t)c->write_ms - (now - c->wait_from_ms);
  struct timespec ts = {0, (long)(left < 5 ? left : 5) * 1000000L};
  nanosleep(&ts, NULL);
  return 1;
}

/* Gives db, a connection c has just opened, its busy handler for the
 * writes from now on (try_open set the open's timeout). */
static void set_write_wait(struct dspk__cache *c, sqlite3 *db) {
  c->backoff_until_ms = 0;
  sqlite3_busy_handler(db, busy_wait, c);
}

/* ---- opening ------------------------------------------------------------- */

/* What a file at the cache's path holds.  classify() decides it by reading
 * only, before anything in the file is changed: a database of another
 * program must be left exactly as it is. */
enum file_class {
  FILE_EMPTY,   /* no tables, user_version 0: becomes a dspk cache */
  FILE_OURS,    /* a dspk cache this build can use (perhaps after migrating) */
  FILE_DAMAGED, /* marked as a dspk cache, but its tables are not those of
                   its schema version */
  FILE_NEWER,   /* a dspk cache of a newer schema: left alone */
  FILE_FOREIGN  /* another program's database: left alone */
};

struct file_info {
  enum file_class cls;
  int app_id, version;
};

enum open_result { OPEN_OK, OPEN_CORRUPT, OPEN_DAMAGED, OPEN_FOREIGN,
                   OPEN_NEWER, OPEN_UNWRITABLE, OPEN_BUSY, OPEN_FAIL,
                   OPEN_OTHERS /* another's file that is no database: left alone
                                  (why says what it is) */ };

/* The database's own tables, not SQLite's internal ones. */
#define USER_TABLES                                                            \
  "SELECT name FROM sqlite_master WHERE type = 'table' AND"                    \
  " name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name"

/* Reads an integer pragma (application_id, user_version) into *out.
 * Returns an sqlite rc. */
static int pragma_int(sqlite3 *db, const char *name, int *out) {
  char sql[64];
  sqlite3_stmt *st = NULL;
  snprintf(sql, sizeof sql, "PRAGMA %s", name);
  int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
  if (rc == SQLITE_OK) {
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
      *out = sqlite3_column_int(st, 0);
      rc = SQLITE_OK;
    } else if (rc == SQLITE_DONE) {
      rc = SQLITE_ERROR;
    }
  }
  sqlite3_finalize(st);
  return rc;
}

/* Writes the database's own tables as "a, b, c" into buf (cut short with
 * ", ..." when it does not fit) and their number into *n.  Returns an
 * sqlite rc. */
static int list_tables(sqlite3 *db, char *buf, size_t len, int *n) {
  sqlite3_stmt *st = NULL;
  size_t used = 0;
  int rc = sqlite3_prepare_v2(db, USER_TABLES, -1, &st, NULL);
  buf[0] = '\0';
  *n = 0;
  while (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
    const char *t = (const char *)sqlite3_column_text(st, 0);
    const char *sep = (*n)++ ? ", " : "";
    size_t need = strlen(sep) + strlen(t ? t : "");
    if (used + need + 6 < len) {
      used += (size_t)snprintf(buf + used, len - used, "%s%s", sep, t ? t : "");
    } else if (used + 6 < len && !strstr(buf, ", ...")) {
      used += (size_t)snprintf(buf + used, len - used, ", ...");
    }
    rc = SQLITE_OK;
  }
  if (rc == SQLITE_DONE)
    rc = SQLITE_OK;
  sqlite3_finalize(st);
  return rc;
}

/* The columns of table t as one comparable string (name, type, NOT NULL,
 * default and primary-key position of each, in order) into buf; "" when
 * there is no such table.  Returns an sqlite rc. */
static int table_sig(sqlite3 *db, const char *t, char *buf, size_t len) {
  sqlite3_stmt *st = NULL;
  int rc = sqlite3_prepare_v2(
      db,
      "SELECT group_concat(name || ' ' || type || ' ' || \"notnull\" || ' ' ||"
      " coalesce(dflt_value, '-') || ' ' || pk, ', ')"
      " FROM (SELECT * FROM pragma_table_info(?1) ORDER BY cid)",
      -1, &st, NULL);
  buf[0] = '\0';
  if (rc != SQLITE_OK)
    return rc;
  sqlite3_bind_text(st, 1, t, -1, SQLITE_STATIC);
  rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) {
    const char *s = (const char *)sqlite3_column_text(st, 0);
    snprintf(buf, len, "%s", s ? s : "");
    rc = SQLITE_OK;
  }
  sqlite3_finalize(st);
  return rc;
}

/* Compares db's tables with those that migrations[0..version) make: the
 * same tables, each with the same columns.  Returns an sqlite rc; *same is
 * 1 when they match, else 0 and the first difference is explained in why. */
static int schema_diff(sqlite3 *db, int version, int *same, char *why,
                       size_t whylen) {
  sqlite3 *ref = NULL;
  sqlite3_stmt *st = NULL;
  char want[2048], have[2048];
  int rc = sqlite3_open_v2(":memory:", &ref,
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL);
  *same = 1;
  for (int v = 0; rc == SQLITE_OK && v < version; v++)
    rc = exec(ref, migrations[v]);
  /* Every table of the reference is there, with its columns ... */
  if (rc == SQLITE_OK)
    rc = sqlite3_prepare_v2(ref, USER_TABLES, -1, &st, NULL);
  while (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
    const char *t = (const char *)sqlite3_column_text(st, 0);
    rc = table_sig(ref, t, want, sizeof want);
    if (rc == SQLITE_OK)
      rc = table_sig(db, t, have, sizeof have);
    if (rc == SQLITE_OK && (!have[0] || strcmp(want, have) != 0)) {
      *same = 0;
      snprintf(why, whylen,
               have[0] ? "the table %s does not have the columns this version"
                         " expects"
                       : "the table %s is missing",
               t);
      break;
    }
  }
  if (rc == SQLITE_DONE)
    rc = SQLITE_OK;
  sqlite3_finalize(st);
  st = NULL;
  /* ... and no table it does not have. */
  if (rc == SQLITE_OK && *same)
    rc = sqlite3_prepare_v2(db, USER_TABLES, -1, &st, NULL);
  while (rc == SQLITE_OK && *same && (rc = sqlite3_step(st)) == SQLITE_ROW) {
    const char *t = (const char *)sqlite3_column_text(st, 0);
    rc = table_sig(ref, t, want, sizeof want);
    if (rc == SQLITE_OK && !want[0]) {
      *same = 0;
      snprintf(why, whylen,
               "it has a table %s, which a dspk cache of schema version %d"
               " does not have",
               t, version);
    }
  }
  if (rc == SQLITE_DONE || rc == SQLITE_ROW)
    rc = SQLITE_OK;
  sqlite3_finalize(st);
  sqlite3_close_v2(ref);
  return rc;
}

/* Decides what the database open in db is (enum file_class), reading only.
 * A dspk cache carries APPLICATION_ID; one made before caches were marked
 * (application_id 0) is recognised by its schema version and exactly the
 * tables and columns of that version.  why explains a FILE_FOREIGN (what
 * it holds: "tables users, orders"), FILE_DAMAGED (what is wrong) or
 * FILE_NEWER.  Returns an sqlite rc: SQLITE_NOTADB or SQLITE_CORRUPT for a
 * file whose header or schema cannot be read. */
static int classify(sqlite3 *db, struct file_info *fi, char *why,
                    size_t whylen) {
  char tables[256], scratch[256];
  int ntables = 0, same = 0;
  int rc = pragma_int(db, "application_id", &fi->app_id);
  if (rc == SQLITE_OK)
    rc = pragma_int(db, "user_version", &fi->version);
  if (rc == SQLITE_OK)
    rc = list_tables(db, tables, sizeof tables, &ntables);
  if (rc != SQLITE_OK)
    return rc;
  if (fi->app_id == APPLICATION_ID) {
    if (fi->version > SCHEMA_VERSION) {
      fi->cls = FILE_NEWER;
      snprintf(why, whylen, "schema version %d; this build's is %d",
               fi->version, SCHEMA_VERSION);
      return SQLITE_OK;
    }
    rc = schema_diff(db, fi->version < 0 ? 0 : fi->version, &same, why,
                     whylen);
    fi->cls = same ? FILE_OURS : FILE_DAMAGED;
    return rc;
  }
  if (fi->app_id == 0 && ntables == 0 && fi->version == 0) {
    fi->cls = FILE_EMPTY;
    return SQLITE_OK;
  }
  if (fi->app_id == 0 && fi->version >= 1 && fi->version <= SCHEMA_VERSION) {
    rc = schema_diff(db, fi->version, &same, scratch, sizeof scratch);
    if (rc != SQLITE_OK)
      return rc;
    if (same) {
      fi->cls = FILE_OURS;
      return SQLITE_OK;
    }
  }
  fi->cls = FILE_FOREIGN;
  if (ntables)
    snprintf(why, whylen, "%s %s", ntables == 1 ? "table" : "tables", tables);
  else if (fi->app_id)
    snprintf(why, whylen, "no tables, application_id %d", fi->app_id);
  else
    snprintf(why, whylen, "no tables, user_version %d", fi->version);
  return SQLITE_OK;
}

static enum open_result class_result(enum file_class cls) {
  switch (cls) {
  case FILE_DAMAGED:
    return OPEN_DAMAGED;
  case FILE_NEWER:
    return OPEN_NEWER;
  case FILE_FOREIGN:
    return OPEN_FOREIGN;
  default:
    return OPEN_OK;
  }
}

static enum open_result rc_result(int rc) {
  if (is_corrupt_rc(rc))
    return OPEN_CORRUPT;
  switch (rc & 0xff) {
  case SQLITE_BUSY: /* another process held its lock past the busy timeout */
  case SQLITE_LOCKED:
    return OPEN_BUSY;
  case SQLITE_READONLY:
  case SQLITE_CANTOPEN:
  case SQLITE_IOERR:
  case SQLITE_PERM:
    return OPEN_UNWRITABLE;
  default:
    return OPEN_FAIL;
  }
}

/* "file:<path, percent-encoded>?mode=ro&immutable=1" (malloc'd), or NULL. */
static char *immutable_uri(const char *path) {
  static const char tail[] = "?mode=ro&immutable=1";
  char *uri = malloc(5 + 3 * strlen(path) + sizeof tail), *p = uri;
  if (!uri)
    return NULL;
  p += sprintf(p, "file:");
  for (const unsigned char *s = (const unsigned char *)path; *s; s++) {
    if ((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
        (*s >= '0' && *s <= '9') || strchr("/._-~", *s))
      *p++ = (char)*s;
    else
      p += sprintf(p, "%%%02X", *s);
  }
  memcpy(p, tail, sizeof tail);
  return uri;
}

/* 1 when the file at path starts with SQLite's 16-byte header string, 0
 * when it does not (or is shorter), and 1 when it cannot be read (the open
 * that follows reports why).  When it does not, and its first bytes are
 * those of one of the files SQLite keeps beside a database (a write-ahead
 * log, a rollback journal, a WAL index), *side names that file ("" else):
 * another database's, never a corrupt cache. */
static int has_sqlite_header(const char *path, const char **side) {
  static const char magic[16] = "SQLite format 3";
  static const unsigned char journal[8] = {0xd9, 0xd5, 0x05, 0xf9, 0x20, 0xa1, 0x63, 0xd7};
  unsigned char head[52];
  uint32_t v0, v48;
  *side = "";
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0)
    return 1;
  ssize_t n = pread(fd, head, sizeof head, 0);
  close(fd);
  if (n < 0)
    return 1;
  if (n >= (ssize_t)sizeof magic && memcmp(head, magic, sizeof magic) == 0)
    return 1;
  /* The WAL's magic is big-endian 0x377f0682 or 0x377f0683; a WAL index
   * (-shm) begins with its version, 3007000, in the host's byte order,
   * twice (offsets 0 and 48). */
  if (n >= 32 && head[0] == 0x37 && head[1] == 0x7f && head[2] == 0x06 &&
      (head[3] & 0xfe) == 0x82)
    *side = "an SQLite write-ahead log (another database's -wal)";
  else if (n >= 28 && memcmp(head, journal, sizeof journal) == 0)
    *side = "an SQLite rollback journal (another database's -journal)";
  else if (n >= 52 && (memcpy(&v0, head, 4), memcpy(&v48, head + 48, 4), v0 == 3007000) &&
           v48 == 3007000)
    *side = "an SQLite WAL index (another database's -shm)";
  return 0;
}

/* Whether another process holds a lock on the regular file at path: an
 * flock(2) (tried shared, without waiting, and let go at once), or, with
 * posix, an fcntl(2) lock (asked with F_GETLK, which takes none): such a
 * file is in use, and is never moved aside.  SQLite locks with fcntl(2)
 * only: an flock is another program's (a lock file). */
static bool locked_by_other(const char *path, bool posix) {
  struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
  bool held;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0)
    return false;
  held = flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  if (!held && posix)
    held = fcntl(fd, F_GETLK, &fl) == 0 && fl.l_type != F_UNLCK;
  close(fd); /* lets a shared flock taken here go */
  return held;
}

/* Looks at the file at path without changing it or creating anything
 * beside it: SQLite's immutable mode takes no lock and makes no -wal or
 * -shm file, which opening a WAL database even read-only would.  Returns
 * OPEN_CORRUPT for a non-empty file that does not start with SQLite's
 * header, OPEN_FOREIGN or OPEN_NEWER (why explains) for a file to leave
 * alone;
 * otherwise OPEN_OK, and try_open decides again with a lock held: a
 * missing, empty or unreadable file, one that looks like a dspk cache, or
 * one another process changed under this unlocked look. */
static enum open_result inspect(const char *path, char *why, size_t whylen) {
  struct stat sb;
  struct file_info fi;
  sqlite3 *db = NULL;
  enum open_result res = OPEN_OK;
  char *uri;
  if (stat(path, &sb) != 0)
    return OPEN_OK; /* missing: created by the open */
  if (!S_ISREG(sb.st_mode)) {
    /* Refused before SQLite sees it: SQLite would make "<path>-journal"
     * beside a device (/dev/null-journal) and then fail with "disk I/O
     * error". */
    snprintf(why, whylen, "not a regular file (%s)",
             S_ISDIR(sb.st_mode)    ? "a directory"
             : S_ISCHR(sb.st_mode)  ? "a character device"
             : S_ISBLK(sb.st_mode)  ? "a block device"
             : S_ISFIFO(sb.st_mode) ? "a FIFO"
             : S_ISSOCK(sb.st_mode) ? "a socket"
                                    : "not a file");
    return OPEN_FAIL;
  }
  /* A lock file (another program's: SQLite never takes an flock), empty
   * or not, is not made a database under the process that holds it. */
  if (locked_by_other(path, false)) {
    snprintf(why, whylen, "a file another process holds an flock(2) on (a lock file)");
    return OPEN_OTHERS;
  }
  if (sb.st_size == 0)
    return OPEN_OK;
  /* What the file is, by its own bytes first: SQLite would take page 1
   * from a "<path>-wal" beside it, which may belong to another file (one
   * that was at the path before). */
  const char *side;
  if (!has_sqlite_header(path, &side)) {
    if (side[0]) {
      snprintf(why, whylen, "%s", side);
      return OPEN_OTHERS;
    }
    snprintf(why, whylen, "its first bytes are not an SQLite header");
    return OPEN_CORRUPT;
  }
  uri = immutable_uri(path);
  if (!uri)
    return OPEN_OK;
  if (sqlite3_open_v2(uri, &db,
                      SQLITE_OPEN_READONLY | SQLITE_OPEN_URI |
                          SQLITE_OPEN_NOMUTEX,
                      NULL) == SQLITE_OK &&
      exec(db, "BEGIN") == SQLITE_OK &&
      classify(db, &fi, why, whylen) == SQLITE_OK &&
      (fi.cls == FILE_FOREIGN || fi.cls == FILE_NEWER))
    res = class_result(fi.cls);
  if (db)
    rollback(db);
  sqlite3_close_v2(db);
  free(uri);
  if (res == OPEN_OK && whylen)
    why[0] = '\0';
  return res;
}

/* The checksum stored with every entry (the column sum): a 128-bit hash of
 * its kind, its key (a blob's name) and what it holds (a kernel's binary; a
 * decision's winner and timings; a blob's data), as hex.  A get compares it
 * with what it read, so that bytes changed in the file (a damaged page that
 * quick_check does not see, an edit by hand) are a miss, never served; the
 * key is in it so that one entry's contents copied into another's row do
 * not pass either.  It guards against damage, not against someone who may
 * write the file (who could write a matching sum as well). */
static void entry_sum(int kind, const char *key, const void *a, size_t alen, const char *b,
                      char out[DSPK__HASH_HEX]) {
  struct dspk__hash h;
  dspk__hash_init(&h);
  dspk__hash_str(&h, "sum/1");
  dspk__hash_u64(&h, (uint64_t)kind);
  dspk__hash_str(&h, key);
  if (kind == DSPK__CACHE_AUTOTUNE) {
    dspk__hash_str(&h, (const char *)a);
    dspk__hash_str(&h, b);
  } else {
    dspk__hash_field(&h, a, alen);
  }
  dspk__hash_hex(&h, out);
}

/* Gives the entries of a cache migrated from version 2 their checksums
 * (inside the migration's transaction).  Returns an sqlite rc. */
static int fill_sums(sqlite3 *db) {
  static const char *const sel[DSPK__CACHE_NKINDS] = {
      "SELECT rowid, key, bin, NULL FROM kernels",
      "SELECT rowid, key, winner, timings FROM autotune",
      "SELECT rowid, name, data, NULL FROM blobs"};
  static const char *const upd[DSPK__CACHE_NKINDS] = {
      "UPDATE kernels SET sum = ?1 WHERE rowid = ?2",
      "UPDATE autotune SET sum = ?1 WHERE rowid = ?2",
      "UPDATE blobs SET sum = ?1 WHERE rowid = ?2"};
  int rc = SQLITE_OK;
  for (int k = 0; rc == SQLITE_OK && k < DSPK__CACHE_NKINDS; k++) {
    sqlite3_stmt *st = NULL, *up = NULL;
    char sum[DSPK__HASH_HEX];
    rc = sqlite3_prepare_v2(db, sel[k], -1, &st, NULL);
    if (rc == SQLITE_OK)
      rc = sqlite3_prepare_v2(db, upd[k], -1, &up, NULL);
    while (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
      const char *key = (const char *)sqlite3_column_text(st, 1);
      if (k == DSPK__CACHE_AUTOTUNE)
        entry_sum(k, key, sqlite3_column_text(st, 2), 0,
                  (const char *)sqlite3_column_text(st, 3), sum);
      else
        entry_sum(k, key, sqlite3_column_blob(st, 2), (size_t)sqlite3_column_bytes(st, 2), NULL,
                  sum);
      sqlite3_reset(up);
      sqlite3_bind_text(up, 1, sum, -1, SQLITE_STATIC);
      sqlite3_bind_int64(up, 2, sqlite3_column_int64(st, 0));
      rc = sqlite3_step(up);
      if (rc == SQLITE_DONE)
        rc = SQLITE_OK;
    }
    if (rc == SQLITE_DONE)
      rc = SQLITE_OK;
    sqlite3_finalize(st);
    sqlite3_finalize(up);
  }
  return rc;
}

/* Makes the file a dspk cache of SCHEMA_VERSION in one write transaction:
 * decides again what it is (another process may have changed it since the
 * first look), marks it (application_id) and applies the migrations.
 * Returns an sqlite rc; with SQLITE_OK, *fi says what was found (only
 * FILE_EMPTY and FILE_OURS were changed). */
static int setup(sqlite3 *db, struct file_info *fi, char *why, size_t whylen) {
  char sql[64];
  int rc = begin_write(db);
  if (rc != SQLITE_OK)
    return rc;
  rc = classify(db, fi, why, whylen);
  if (rc != SQLITE_OK || (fi->cls != FILE_EMPTY && fi->cls != FILE_OURS))
    goto out;
  if (fi->app_id != APPLICATION_ID) {
    snprintf(sql, sizeof sql, "PRAGMA application_id=%d", APPLICATION_ID);
    rc = exec(db, sql);
  }
  for (int v = fi->version; rc == SQLITE_OK && v < SCHEMA_VERSION; v++) {
    rc = exec(db, migrations[v]);
    if (rc == SQLITE_OK && v == 2)
      rc = fill_sums(db);
  }
  if (rc == SQLITE_OK && fi->version != SCHEMA_VERSION) {
    snprintf(sql, sizeof sql, "PRAGMA user_version=%d", SCHEMA_VERSION);
    rc = exec(db, sql);
  }
  if (rc == SQLITE_OK)
    rc = exec(db, "COMMIT");
out:
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

/* Whether a write of one of the files of the database path could have
 * failed for the file size limit lim: what SQLite writes at its end (the
 * file itself, its -wal, its -journal: one byte at least) or, for its -shm,
 * the next region it maps (32 KiB) would go past lim.  A write that crosses
 * lim writes up to it and fails the next time, so the file is then at lim;
 * what SQLite was writing is not known beyond that. */
static bool at_fsize_limit(const char *path, unsigned long long lim) {
  static const struct {
    const char *suffix;
    unsigned long long next; /* the bytes SQLite writes next at its end, at least */
  } files[] = {{"", 1}, {"-wal", 1}, {"-journal", 1}, {"-shm", 32768}};
  char name[PATH_MAX + 16];
  struct stat st;

  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    int n = snprintf(name, sizeof name, "%s%s", path, files[i].suffix);
    if (n < 0 || (size_t)n >= sizeof name || stat(name, &st) != 0 || !S_ISREG(st.st_mode))
      continue;
    if ((unsigned long long)st.st_size + files[i].next > lim)
      return true;
  }
  return false;
}

/* The operating system's reason under SQLite's rc on db, in out (""
 * when rc is not a system call's failure, or none is found): the errno
 * SQLite kept, else, where its later calls lost it (a failed write of the
 * -wal, a -wal or -shm that cannot be made: it then says "disk I/O error"
 * or "attempt to write a readonly database" alone), the cause asked of the
 * system again: a directory the file's -wal and -shm cannot be made in, a
 * file size limit (RLIMIT_FSIZE) one of its files is at, a full file
 * system. */
static void sys_reason(sqlite3 *db, int rc, char *out, size_t len) {
  int p = rc & 0xff, e;
  const char *path = db ? sqlite3_db_filename(db, "main") : NULL;
  char dir[PATH_MAX];
  struct rlimit rl;
  struct statvfs vfs;

  out[0] = '\0';
  /* Only where a system call is the cause: the errno of another code's
   * failure may be an old one. */
  if (!db || (p != SQLITE_CANTOPEN && p != SQLITE_IOERR && p != SQLITE_READONLY &&
              p != SQLITE_PERM && p != SQLITE_FULL))
    return;
  if ((e = sqlite3_system_errno(db)) != 0) {
    snprintf(out, len, "%s", strerror(e));
    return;
  }
  if (!path || !path[0])
    return;
  const char *slash = strrchr(path, '/');
  size_t n = !slash ? 1 : slash == path ? 1 : (size_t)(slash - path);
  if (n >= sizeof dir)
    return;
  memcpy(dir, slash ? path : ".", n);
  dir[n] = '\0';
  if (p != SQLITE_FULL && faccessat(AT_FDCWD, dir, W_OK | X_OK, AT_EACCESS) != 0) {
    snprintf(out, len, "cannot create its -wal and -shm in %.200s: %s", dir, strerror(errno));
    return;
  }
  if ((p == SQLITE_IOERR || p == SQLITE_FULL) && getrlimit(RLIMIT_FSIZE, &rl) == 0 &&
      rl.rlim_cur != RLIM_INFINITY && at_fsize_limit(path, (unsigned long long)rl.rlim_cur)) {
    snprintf(out, len, "%s (RLIMIT_FSIZE is %llu bytes)", strerror(EFBIG),
             (unsigned long long)rl.rlim_cur);
    return;
  }
  if ((p == SQLITE_IOERR || p == SQLITE_FULL) && statvfs(dir, &vfs) == 0 && vfs.f_bavail == 0)
    snprintf(out, len, "%s", strerror(ENOSPC));
}

/* Why SQLite failed with rc, for a person: its text for rc and, when a
 * system call failed under it, the operating system's reason ("unable to
 * open database file" alone names no cause: permissions, a read-only file
 * system, a name too long...). */
static void sql_why(sqlite3 *db, int rc, const char *prefix, char *why, size_t whylen) {
  char sys[320];
  sys_reason(db, rc, sys, sizeof sys);
  snprintf(why, whylen, "%s%s%s%s", prefix, sqlite3_errstr(rc), sys[0] ? ": " : "", sys);
}

/* Opens path and makes it ready: decides what the file is before writing
 * anything (inspect, then classify with a lock held), then quick_check,
 * WAL, busy timeout, schema.  On OPEN_OK writes *out; otherwise closes
 * what it opened and explains in why. */
static enum open_result try_open(const char *path, int busy_ms, sqlite3 **out,
                                 char *why, size_t whylen) {
  sqlite3 *db = NULL;
  struct file_info fi;
  int mem = strcmp(path, ":memory:") == 0;
  enum open_result res = OPEN_FAIL;
  int rc;
  why[0] = '\0';
  if (!mem && (res = inspect(path, why, whylen)) != OPEN_OK)
    return res;
  /* SQLite never creates the cache file (no SQLITE_OPEN_CREATE): it would
   * make it mode 0644 (SQLITE_DEFAULT_FILE_PERMISSIONS), and its -wal and
   * -shm with it (probe 22 E1).  open_file made it 0600 (create_private)
   * before this open, on every path: fresh, rebuilt, made again after a
   * deletion, through a symbolic link; SQLite gives the -wal, -shm and
   * -journal it creates the main file's mode.  Only ":memory:" is
   * created here. */
  rc = sqlite3_open_v2(path, &db,
                       SQLITE_OPEN_READWRITE | (mem ? SQLITE_OPEN_CREATE : 0) |
                           SQLITE_OPEN_NOMUTEX,
                       NULL);
  if (rc != SQLITE_OK) {
    sql_why(db, rc, "", why, whylen);
    /* A file that is not there (open_file could not make it, or it went
     * meanwhile): SQLite's system call says only that there is no file;
     * where this process may not create one, the directory says why. */
    struct stat st;
    if (!mem && (rc & 0xff) == SQLITE_CANTOPEN && stat(path, &st) != 0 && errno == ENOENT) {
      char dir[PATH_MAX];
      const char *slash = strrchr(path, '/');
      size_t n = !slash ? 1 : slash == path ? 1 : (size_t)(slash - path);
      if (n < sizeof dir) {
        memcpy(dir, slash ? path : ".", n);
        dir[n] = '\0';
        if (faccessat(AT_FDCWD, dir, W_OK | X_OK, AT_EACCESS) != 0)
          snprintf(why, whylen, "%s: cannot create it in %.200s: %s", sqlite3_errstr(rc), dir,
                   strerror(errno));
      }
    }
    res = (rc & 0xff) == SQLITE_CANTOPEN || (rc & 0xff) == SQLITE_PERM ||
                  (rc & 0xff) == SQLITE_READONLY
              ? OPEN_UNWRITABLE
              : OPEN_FAIL;
    goto fail;
  }
  sqlite3_extended_result_codes(db, 1);
  sqlite3_busy_timeout(db, busy_ms);
  if (sqlite3_db_readonly(db, "main") == 1) {
    /* SQLite fell back to reading only, its system call's errno gone: the
     * reason asked again (a read-only file system, permissions, an
     * immutable file), after SQLite's text as every other reason. */
    int e = faccessat(AT_FDCWD, path, W_OK, AT_EACCESS) != 0 ? errno : 0;
    if (e)
      snprintf(why, whylen, "%s: %s", sqlite3_errstr(SQLITE_READONLY), strerror(e));
    else
      snprintf(why, whylen, "%s: the file is read-only", sqlite3_errstr(SQLITE_READONLY));
    res = OPEN_UNWRITABLE;
    goto fail;
  }
  /* What it is, read under a shared lock before anything is written: a
   * file that is not a database fails here. */
  rc = exec(db, "BEGIN");
  if (rc == SQLITE_OK)
    rc = classify(db, &fi, why, whylen);
  rollback(db);
  if (rc != SQLITE_OK) {
    sql_why(db, rc, "", why, whylen);
    res = rc_result(rc);
    goto fail;
  }
  if ((res = class_result(fi.cls)) != OPEN_OK)
    goto fail;
  if (fi.cls == FILE_OURS) {
    rc = quick_check(db, why, whylen);
    if (rc != SQLITE_OK) {
      if (rc != SQLITE_CORRUPT || !why[0])
        snprintf(why, whylen, "%s", sqlite3_errstr(rc));
      res = is_corrupt_rc(rc) ? OPEN_CORRUPT : OPEN_FAIL;
      goto fail;
    }
  }
  if (!mem) {
    /* auto_vacuum only takes effect on a new, empty file (and would write
     * the header of another one); it lets clear() give pages back to the
     * file system. */
    if (fi.cls == FILE_EMPTY)
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
      sql_why(db, rc, "cannot enable WAL: ", why, whylen);
      res = rc_result(rc);
      goto fail;
    }
    /* In WAL mode NORMAL keeps the file consistent across a process crash;
     * only a power loss may drop the last commits, which a cache tolerates. */
    exec(db, "PRAGMA synchronous=NORMAL");
  }
  rc = setup(db, &fi, why, whylen);
  if (rc != SQLITE_OK) {
    sql_why(db, rc, "", why, whylen);
    res = rc_result(rc);
    goto fail;
  }
  if ((res = class_result(fi.cls)) != OPEN_OK)
    goto fail;
  *out = db;
  return OPEN_OK;
fail:
  sqlite3_close_v2(db);
  return res;
}

/* rename(from, to) that never replaces an existing to: -1 with EEXIST
 * then.  RENAME_NOREPLACE where the file system has it; elsewhere link(2)
 * (which fails on an existing name too) and unlink, else a check and a
 * rename (only a race with another process can replace then). */
static int rename_noreplace(const char *from, const char *to) {
  struct stat sb;
  if (renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE) == 0)
    return 0;
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
    return -1;
  if (link(from, to) == 0)
    return unlink(from) == 0 || errno == ENOENT ? 0 : -1;
  if (errno == EEXIST || errno == ENOENT)
    return -1;
  if (lstat(to, &sb) == 0) {
    errno = EEXIST;
    return -1;
  }
  return rename(from, to);
}

/* Renames path and its -wal/-shm companions to "<path>.corrupt-<time>",
 * or, when a file of that name (or one of its companions) is already
 * there (a second recovery in the same second), "<path>.corrupt-<time>.N"
 * with the lowest free N from 1: a file kept aside is never replaced.
 * Writes the new main name into moved.  Returns 0 or -errno. */
static int move_aside(const char *path, char *moved, size_t len) {
  static const char *const suffix[] = {"", "-wal", "-shm"};
  long t = (long)now_s();
  char base[4200];
  for (int n = 0;; n++) {
    struct stat sb;
    if (n == 0)
      snprintf(base, sizeof base, "%s.corrupt-%ld", path, t);
    else
      snprintf(base, sizeof base, "%s.corrupt-%ld.%d", path, t, n);
    int taken = 0;
    for (size_t i = 1; i < 3 && !taken; i++) {
      char to[4300];
      snprintf(to, sizeof to, "%s%s", base, suffix[i]);
      taken = lstat(to, &sb) == 0;
    }
    if (taken)
      continue;
    if (rename_noreplace(path, base) == 0)
      break;
    if (errno != EEXIST || n >= 1000)
      return -errno;
  }
  snprintf(moved, len, "%s", base);
  for (size_t i = 1; i < 3; i++) {
    char from[4096], to[4300];
    snprintf(from, sizeof from, "%s%s", path, suffix[i]);
    snprintf(to, sizeof to, "%s%s", base, suffix[i]);
    if (rename_noreplace(from, to) != 0 && errno != ENOENT)
      unlink(from); /* a companion of a corrupt file is useless */
  }
  return 0;
}

/* The file path names when path is a symbolic link (the whole chain
 * resolved), in out; NULL when it is not one or cannot be resolved. */
static const char *link_target(const char *path, char *out, size_t len) {
  struct stat sb;
  if (len < PATH_MAX || lstat(path, &sb) != 0 || !S_ISLNK(sb.st_mode) || !realpath(path, out))
    return NULL;
  return out;
}

/* What stood at a cache path and at its SQLite companions before
 * open_file made anything there, so that the clean-up after an unusable
 * cache removes only what this process made (outside probe 20 E1: with no
 * cache file yet, another user's "<path>-wal", or a symbolic link at
 * "<path>-shm", was removed with the empty file this process had made,
 * and the warning then told the admin to chown or remove it). */
struct made {
  int file;               /* this process made the cache file (O_EXCL) */
  dev_t dev;              /* which file that is, when file */
  ino_t ino;
  unsigned had;           /* bit i: name i of made_suffix existed before */
};

static const char *const made_suffix[] = {"", "-wal", "-shm", "-journal"};

/* Records in m which of path and its companions exist now (lstat: a
 * symbolic link, dangling or not, counts). */
static void made_snapshot(const char *path, struct made *m) {
  char p[4200];
  struct stat sb;
  m->had = 0;
  for (unsigned i = 0; i < 4; i++) {
    snprintf(p, sizeof p, "%s%s", path, made_suffix[i]);
    if (lstat(p, &sb) == 0 || errno != ENOENT)
      m->had |= 1u << i;
  }
}

/* Makes path a new, empty regular file of mode 0600 whatever the umask
 * (open(2) gives 0600 & ~umask: mode 000 under umask 0777), never through
 * a symbolic link (O_EXCL | O_NOFOLLOW), and records it in m.  The cache
 * file is always made here, never by SQLite (try_open: SQLite would make
 * it 0644, probe 22 E1), so that no other user reads which uid ran which
 * kernel; SQLite gives the -wal, -shm and -journal it makes beside it the
 * file's mode.  0, or -errno (-EEXIST: something is there now). */
static int create_private(const char *path, struct made *m) {
  struct stat sb;
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0)
    return -errno;
  if (fstat(fd, &sb) == 0) {
    m->file = 1;
    m->dev = sb.st_dev;
    m->ino = sb.st_ino;
    if ((sb.st_mode & 07777) != 0600)
      (void)fchmod(fd, 0600); /* a failure leaves the umask's mode: narrower, never wider */
  }
  close(fd);
  return 0;
}

/* The reason a cache file could not be made at path (errno e), in why:
 * SQLite's words for a file it cannot open, then the directory and the
 * system's reason. */
static void cannot_create(const char *path, int e, char *why, size_t len) {
  const char *slash = strrchr(path, '/');
  int n = !slash ? 1 : slash == path ? 1 : (int)(slash - path);
  snprintf(why, len, "%s: cannot create it in %.*s: %s", sqlite3_errstr(SQLITE_CANTOPEN),
           n > 200 ? 200 : n, slash ? path : ".", strerror(e));
}

/* For a symbolic link at path whose chain ends at no file (an admin's
 * link to a cache on another disk, made before the first start): the name
 * the chain ends at, in out, where the cache file is to be made (SQLite
 * opens path through the link, and resolves it as the kernel does).  NULL
 * when path is no such link, or the chain cannot be followed, or a link
 * of it belongs to another user than root or this process's (who could
 * point it anywhere: nothing is made through it). */
static const char *dangling_target(const char *path, char *out, size_t len) {
  char cur[PATH_MAX], to[PATH_MAX];
  struct stat sb;
  if (lstat(path, &sb) != 0 || !S_ISLNK(sb.st_mode) || stat(path, &sb) == 0 ||
      errno != ENOENT || strlen(path) >= sizeof cur)
    return NULL;
  memcpy(cur, path, strlen(path) + 1);
  for (int hops = 0; hops < 40; hops++) {
    if (lstat(cur, &sb) != 0) {
      if (errno != ENOENT || strlen(cur) >= len)
        return NULL;
      memcpy(out, cur, strlen(cur) + 1);
      return out;
    }
    if (!S_ISLNK(sb.st_mode) || (sb.st_uid != 0 && sb.st_uid != geteuid()))
      return NULL;
    ssize_t n = readlink(cur, to, sizeof to - 1);
    if (n <= 0)
      return NULL;
    to[n] = '\0';
    /* A relative target is its link's directory's. */
    char *slash = strrchr(cur, '/');
    size_t dl = to[0] == '/' || !slash ? 0 : (size_t)(slash - cur) + 1;
    if (dl + (size_t)n >= sizeof cur)
      return NULL;
    memcpy(cur + dl, to, (size_t)n + 1);
  }
  return NULL;
}

/* Removes the files at at (path, or the file a symbolic link at path
 * names) and its SQLite companions that this process
 * created while trying to open a cache there (an unusable location must
 * not be left with an empty cache file, nor a full disk with its -wal):
 * each one that did not exist at the snapshot (m->had) and is a regular
 * file of this process's user, and the cache file only when it is the one
 * made (m->dev, m->ino) where this process made it.  Anything else (a
 * file of another user, a symbolic link, one that was there before) is
 * left alone: it is not this process's to remove. */
static void remove_created(const char *path, const char *at, int created, const struct made *m,
                           int dirs) {
  char p[4200];
  struct stat sb;
  for (unsigned i = 0; created && i < 4; i++) {
    snprintf(p, sizeof p, "%s%s", at, made_suffix[i]);
    if ((m->had & (1u << i)) || lstat(p, &sb) != 0 || !S_ISREG(sb.st_mode) ||
        sb.st_uid != geteuid())
      continue;
    if (i == 0 && m->file && (sb.st_dev != m->dev || sb.st_ino != m->ino))
      continue;
    unlink(p);
  }
  /* The directories mkdirs_for made (the deepest `dirs` of the path's),
   * deepest first; rmdir leaves one that is no longer empty. */
  snprintf(p, sizeof p, "%s", path);
  for (int i = 0; i < dirs; i++) {
    char *slash = strrchr(p, '/');
    if (!slash || slash == p)
      break;
    *slash = '\0';
    if (rmdir(p) != 0)
      break;
  }
}

/* Remembers which file c->path names now, so that a put can notice when
 * it was deleted or replaced (follow_path). */
static void remember_file(struct dspk__cache *c) {
  static const char *const suffix[2] = {"-wal", "-shm"};
  struct stat sb;
  char p[PATH_MAX + 8];
  c->have_id = stat(c->path, &sb) == 0;
  if (c->have_id) {
    c->dev = sb.st_dev;
    c->ino = sb.st_ino;
  }
  for (int i = 0; i < 2; i++) {
    c->side[i].have = c->have_id &&
                      (size_t)snprintf(p, sizeof p, "%s%s", c->path, suffix[i]) <
                          sizeof p &&
                      lstat(p, &sb) == 0;
    if (c->side[i].have) {
      c->side[i].dev = sb.st_dev;
      c->side[i].ino = sb.st_ino;
    }
  }
}

/* Called when c->path no longer names the open file (deleted, or another
 * file renamed over it), before anything opens the path again.  The open
 * connection's "<path>-wal" and "-shm" stay at the path: SQLite neither
 * checkpoints a moved file when closing it nor deletes those by name.  Any
 * SQLite open of the path would then replay the old cache's log over the
 * file there now (another program's database would lose its tables, a
 * file of garbage would read as a cache).  So: first checkpoint the log
 * into the old file through the open connection (a file moved elsewhere
 * keeps every commit), then remove the two side files, but only when they
 * are still the ones this connection made (same device and inode): side
 * files that came with the new file are its own and are left alone. */
static void drop_side_files(struct dspk__cache *c) {
  static const char *const suffix[2] = {"-wal", "-shm"};
  struct stat sb;
  char p[PATH_MAX + 8];
  /* Best effort: a reader of another process may keep part of the log;
   * what it keeps still goes with the old file, not the new one. */
  (void)sqlite3_wal_checkpoint_v2(c->db, "main", SQLITE_CHECKPOINT_TRUNCATE,
                                  NULL, NULL);
  for (int i = 0; i < 2; i++) {
    if (!c->side[i].have ||
        (size_t)snprintf(p, sizeof p, "%s%s", c->path, suffix[i]) >= sizeof p)
      continue;
    if (lstat(p, &sb) == 0 && sb.st_dev == c->side[i].dev &&
        sb.st_ino == c->side[i].ino)
      (void)unlink(p); /* the open connection keeps its descriptors */
    c->side[i].have = 0;
  }
}

/* Whether the cache at path, and what SQLite opens with it, are safe from
 * other users (outside probe 16 E1: a cache file others could write gave
 * every client the kernels they put there; another user's symbolic link
 * at the path made a corrupt-file recovery move aside and overwrite the
 * file it pointed to).  The rule of every file dspkd trusts
 * (dspk__trust_stat): a symbolic link at path owned by root or this
 * process's user (an admin's link to another disk, never one another user
 * planted), the directory that holds path and, through a link, the one
 * that holds its target, the file, and its -wal, -shm and -journal beside
 * it (never symbolic links), each owned by root or this process's user and
 * not writable by group or others (a directory may be, with the sticky
 * bit).  0, or -1 with why: what is wrong, and the fix. */
static int check_trust(const char *path, char *why, size_t len) {
  static const char *const side[] = {"-wal", "-shm", "-journal"};
  uid_t self = geteuid();
  char target[PATH_MAX], dir[PATH_MAX], p[PATH_MAX + 16], w[300];
  const char *file = path, *what = "the file";
  struct stat sb;

  if (lstat(path, &sb) == 0 && S_ISLNK(sb.st_mode)) {
    if (dspk__trust_stat(&sb, self, 1, NULL, w, sizeof w) != 0) {
      snprintf(why, len, "it is a symbolic link %s (another user's link: it could point at "
               "any file); remove it, or give the cache another path", w);
      return -1;
    }
    if (realpath(path, target))
      file = target;
  }
  if (dspk__trust_dir_of(path, self, 1, NULL, dir, sizeof dir, w, sizeof w) != 0)
    goto dir_bad;
  if (file != path && dspk__trust_dir_of(file, self, 1, NULL, dir, sizeof dir, w,
                                         sizeof w) != 0)
    goto dir_bad;
  for (size_t i = 0; i <= sizeof side / sizeof side[0]; i++) {
    if (i) {
      snprintf(p, sizeof p, "%s%s", file, side[i - 1]);
      what = p;
    }
    if (lstat(i ? p : file, &sb) != 0)
      continue;
    if (i && S_ISLNK(sb.st_mode)) {
      snprintf(why, len, "%s, a file SQLite keeps beside it, is a symbolic link; remove it",
               p);
      return -1;
    }
    if ((i || S_ISREG(sb.st_mode)) &&
        dspk__trust_stat(&sb, self, 1, NULL, w, sizeof w) != 0) {
      snprintf(why, len, "%s is %s: another user could change the cache, whose kernels every "
               "client runs; chown it to this user (or root) and chmod go-w it, or give the "
               "cache another path", what, w);
      return -1;
    }
  }
  return 0;
dir_bad:
  snprintf(why, len, "its directory %s is %s: another user could replace the cache; chown "
           "it to this user (or root) and chmod go-w it (or +t), or give the cache another "
           "path", dir, w);
  return -1;
}

/* Opens the file c->path for the cache, creating its directories; a
 * corrupt file, or a dspk cache whose schema is damaged, is moved aside
 * and rebuilt.  Returns 0 with *db set (warn: "" or the line to log about
 * a rebuild), 1 when the caller must use an in-memory cache instead (warn:
 * the line to log, which says so), or a negative dspk_errno (DSPK_EIO for
 * an unusable file with no_fallback). */
static int open_file(struct dspk__cache *c, int no_fallback, sqlite3 **db,
                     char *warn, size_t warnlen) {
  char why[PATH_MAX + 768] = "", first[256], moved[4200], target[PATH_MAX];
  const char *what, *at = c->path;
  struct stat sb;
  /* A file (and directories) this call creates are removed again when it
   * ends up unusable (a full disk left an empty file behind). */
  int created = 0, dirs = 0;
  struct made made = {0};
  size_t plen = strlen(c->path);
  /* "DIR/c.db/" named a directory to make: mkdirs_for made c.db one, and
   * the warning then said the path was "a directory" where nothing had
   * been. */
  if (plen > 1 && c->path[plen - 1] == '/') {
    snprintf(why, sizeof why, "the path ends in /: it names a directory, not a file");
    goto unusable;
  }
  int mk = mkdirs_for(c->path, &dirs);
  if (mk < 0) {
    snprintf(why, sizeof why, "cannot create its directory: %s",
             strerror(-mk));
    goto unusable;
  }
  /* Where the file is made: the path, or the name a symbolic link there
   * ends at when that is no file yet (an admin's link to another disk,
   * made before the first start: SQLite made the target 0644). */
  at = dangling_target(c->path, target, sizeof target);
  if (!at)
    at = c->path;
  /* Nothing is made through a link, nor beside it, before the link and
   * its directory passed (check_trust again below, once the file is
   * there, for the directory that holds it). */
  else if (check_trust(c->path, why, sizeof why) != 0)
    goto unusable;
  made_snapshot(at, &made);
  created = lstat(at, &sb) != 0 && errno == ENOENT;
  /* A missing file is made here, 0600 whatever the umask and never
   * through a symbolic link (a link planted meanwhile is found by the
   * check below), never by SQLite (create_private). */
  if (created) {
    int e = create_private(at, &made);
    if (e < 0) {
      created = 0; /* -EEXIST: made meanwhile, by another process: not ours */
      if (e != -EEXIST) {
        cannot_create(at, -e, why, sizeof why);
        goto unusable;
      }
    }
  }
  if (check_trust(c->path, why, sizeof why) != 0)
    goto unusable;
  enum open_result r = try_open(c->path, c->busy_ms, db, why, sizeof why);
  switch (r) {
  case OPEN_OK:
    return 0;
  case OPEN_CORRUPT:
  case OPEN_DAMAGED:
    if (no_fallback)
      return DSPK_EIO;
    snprintf(first, sizeof first, "%.200s", why);
    what = r == OPEN_CORRUPT ? "was corrupt"
                             : "is a dspk cache with a damaged schema";
    /* Through a symbolic link (the cache put on another disk) the file is
     * the link's target: that is moved aside and rebuilt, where SQLite
     * opens it through the link; the link stays. */
    const char *aside = link_target(c->path, target, sizeof target);
    /* A file another process holds a lock on is in use: never moved
     * aside under it. */
    if (locked_by_other(aside ? aside : c->path, true)) {
      snprintf(why, sizeof why, "%s (%s), but another process holds a lock on it: "
               "leaving it alone", r == OPEN_CORRUPT ? "corrupt" : "damaged schema", first);
      goto unusable;
    }
    int mv = move_aside(aside ? aside : c->path, moved, sizeof moved);
    if (mv < 0) {
      snprintf(why, sizeof why, "%s (%s) and cannot be moved aside: %s",
               r == OPEN_CORRUPT ? "corrupt" : "damaged schema", first,
               strerror(-mv));
      goto unusable;
    }
    /* The new file made 0600 as a missing one is (create_private), where
     * the old one was: SQLite made it 0644 (probe 22 E1). */
    at = aside ? aside : c->path;
    made_snapshot(at, &made); /* what the move left there is not new */
    made.file = 0;
    int e = create_private(at, &made);
    created = e == 0;
    if (e < 0 && e != -EEXIST) {
      cannot_create(at, -e, why, sizeof why);
      goto unusable;
    }
    if (try_open(c->path, c->busy_ms, db, why, sizeof why) != OPEN_OK)
      goto unusable;
    if (aside)
      setwarn(warn, warnlen, "cache file %s (a symbolic link to %s) %s (%s); moved %s to %s "
              "and rebuilt it there (the link stays)", c->path, aside, what, first, aside,
              moved);
    else
      setwarn(warn, warnlen, "cache file %s %s (%s); moved it to %s and rebuilt it",
              c->path, what, first, moved);
    return 0;
  case OPEN_FOREIGN:
    if (no_fallback)
      return DSPK_EIO;
    setwarn(warn, warnlen,
            "cache file %s is an SQLite database of another program (%s):"
            " leaving it alone; using an in-memory cache",
            c->path, why);
    return 1;
  case OPEN_NEWER:
    if (no_fallback)
      return DSPK_EIO;
    setwarn(warn, warnlen,
            "cache file %s was made by a newer dspk (%s): leaving it alone;"
            " using an in-memory cache",
            c->path, why);
    return 1;
  case OPEN_OTHERS:
    if (no_fallback)
      return DSPK_EIO;
    setwarn(warn, warnlen,
            "cache file %s is %s: leaving it alone; using an in-memory cache", c->path, why);
    return 1;
  case OPEN_BUSY:
    /* Transient: another process (a daemon rebuilding a shared cache, an
     * sqlite3 .backup) held its lock longer than the busy timeout. */
    if (created || dirs)
      remove_created(c->path, at, created, &made, dirs);
    if (no_fallback)
      return DSPK_EBUSY;
    c->busy_retry = 1;
    setwarn(warn, warnlen,
            "cache file %s is locked by another process (%s after %d ms);"
            " using an in-memory cache until it is free (each store tries the"
            " file again)",
            c->path, why, c->busy_ms);
    return 1;
  default:
    break;
  }
unusable:
  if (created || dirs)
    remove_created(c->path, at, created, &made, dirs);
  if (no_fallback)
    return DSPK_EIO;
  setwarn(warn, warnlen, "cache file %s is unusable (%s); using an in-memory cache",
          c->path, why);
  return 1;
}

/* See cache.h. */
int dspk__cache_open(const char *path, const struct dspk__cache_opts *opts,
                     struct dspk__cache **out, char *warn, size_t warnlen) {
  struct dspk__cache *c = NULL;
  sqlite3 *db = NULL;
  char why[512] = "";
  int no_fallback = opts && opts->no_fallback;
  int err;

  if (warn && warnlen)
    warn[0] = '\0';
  c = calloc(1, sizeof *c);
  if (!c)
    return DSPK_ENOMEM;
  c->max_bytes = opts && opts->max_bytes ? opts->max_bytes : DEFAULT_MAX_BYTES;
  c->busy_ms = opts && opts->busy_timeout_ms > 0 ? opts->busy_timeout_ms
                                                 : DEFAULT_BUSY_MS;
  c->write_ms = opts && opts->write_timeout_ms > 0 ? opts->write_timeout_ms
                                                   : DEFAULT_WRITE_MS;
  if (opts) {
    c->notice = opts->notice;
    c->notice_ud = opts->notice_ud;
    c->put_result = opts->put_result;
    c->dropped = opts->dropped;
  }
  c->path = path ? strdup(path) : default_path();
  if (!c->path) {
    if (path) {
      err = DSPK_ENOMEM;
      goto err_free;
    }
    if (no_fallback) {
      err = DSPK_EIO;
      goto err_free;
    }
    setwarn(warn, warnlen,
            "cache file (default) is unusable (no home directory to hold it);"
            " using an in-memory cache");
    goto memory;
  }
  if (strcmp(c->path, ":memory:") == 0)
    goto memory;
  err = open_file(c, no_fallback, &db, warn, warnlen);
  if (err < 0)
    goto err_free;
  if (err == 0) {
    remember_file(c);
    set_write_wait(c, db);
    goto ready;
  }

memory:
  if (try_open(":memory:", c->busy_ms, &db, why, sizeof why) != OPEN_OK) {
    err = DSPK_EIO;
    goto err_free;
  }
  atomic_store(&c->in_memory, 1);

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

/* Copies what the in-memory cache holds into the file attached to its
 * connection as "f" (one transaction), after the file's own entries in
 * recency: the memory's ticks are moved past the file's clock, which is
 * advanced by as much.  An entry the file has already is kept as the file
 * has it.  Returns the entries copied, or a negative sqlite rc. */
static int64_t copy_into_file(sqlite3 *mem) {
  static const char *const step[] = {
      "UPDATE main.kernels SET tick = tick + (SELECT v FROM f.meta WHERE k = 'tick')",
      "UPDATE main.autotune SET tick = tick + (SELECT v FROM f.meta WHERE k = 'tick')",
      "UPDATE main.blobs SET tick = tick + (SELECT v FROM f.meta WHERE k = 'tick')",
      "INSERT OR IGNORE INTO f.kernels SELECT * FROM main.kernels",
      "INSERT OR IGNORE INTO f.autotune SELECT * FROM main.autotune",
      "INSERT OR IGNORE INTO f.blobs SELECT * FROM main.blobs",
      "UPDATE f.meta SET v = v + (SELECT v FROM main.meta WHERE k = 'tick')"
      " WHERE k = 'tick'"};
  int64_t copied = 0;
  int rc = exec(mem, "BEGIN IMMEDIATE");
  for (size_t i = 0; rc == SQLITE_OK && i < sizeof step / sizeof step[0]; i++) {
    rc = exec(mem, step[i]);
    if (rc == SQLITE_OK && i >= 3 && i < 6)
      copied += sqlite3_changes(mem);
  }
  if (rc == SQLITE_OK)
    rc = exec(mem, "COMMIT");
  if (rc != SQLITE_OK) {
    rollback(mem);
    return -rc;
  }
  return copied;
}

/* Called with the mutex held before each put while the cache is in memory
 * because its file was locked at open: opens the file again, waiting at
 * most write_ms for the lock (a put must not wait the full busy
 * timeout each time).  Still locked: stays in memory and tries at the next
 * put.  Opened: what was stored in memory meanwhile is copied into it, the
 * cache goes on with the file, and one line goes to opts.notice.  Another
 * failure (the file became unusable): stays in memory for good, and says
 * so. */
static void retry_busy(struct dspk__cache *c) {
  char warn[1024] = "", line[1400];
  sqlite3 *db = NULL, *mem = c->db;
  int busy_ms = c->busy_ms;
  c->busy_retry = 0;
  c->busy_ms = c->write_ms;
  int r = open_file(c, 0, &db, warn, sizeof warn);
  c->busy_ms = busy_ms;
  if (r != 0) {
    if (c->busy_retry)
      return; /* still locked: no line, the next put tries again */
    snprintf(line, sizeof line, "%s", warn);
  } else {
    set_write_wait(c, db);
    sqlite3_stmt *st = NULL;
    int64_t copied = -1;
    sqlite3_busy_timeout(mem, c->write_ms); /* the copy waits no longer than a put */
    if (sqlite3_prepare_v2(mem, "ATTACH DATABASE ?1 AS f", -1, &st, NULL) == SQLITE_OK) {
      sqlite3_bind_text(st, 1, c->path, -1, SQLITE_STATIC);
      if (sqlite3_step(st) == SQLITE_DONE)
        copied = copy_into_file(mem);
      sqlite3_finalize(st);
      exec(mem, "DETACH DATABASE f");
    }
    remember_file(c);
    c->db = db;
    atomic_store(&c->in_memory, 0);
    sqlite3_close_v2(mem);
    if (copied >= 0)
      snprintf(line, sizeof line,
               "cache file %s is no longer locked: using it (%lld %s stored in memory"
               " meanwhile copied into it)%s%s",
               c->path, (long long)copied, copied == 1 ? "entry" : "entries",
               warn[0] ? "; " : "", warn);
    else
      snprintf(line, sizeof line,
               "cache file %s is no longer locked: using it (what was stored in memory"
               " meanwhile could not be copied into it and is dropped)%s%s",
               c->path, warn[0] ? "; " : "", warn);
  }
  if (c->notice)
    c->notice(c->notice_ud, line);
}

/* What follow_path found, for its notice: nothing at the path (the file
 * deleted, or moved away with or without its directory: "deleted" alone
 * sent the admin looking for lost data, probe 22 E2), or another file. */
#define GONE_WHY(gone) ((gone) ? "is no longer there (deleted or moved away, or its " \
                                 "directory was)" \
                               : "was replaced while in use")

/* Called with the mutex held before each put.  When c->path no longer
 * names the file that is open (it was deleted, or another file was renamed
 * over it), everything stored would go into a file nobody will open again:
 * opens the path again by the rules of dspk__cache_open (a new cache where
 * nothing is left; the file that is there now otherwise), or an in-memory
 * cache when that fails, and hands one line to opts.notice.  One stat(2)
 * per put; reads and hits are not checked. */
static void follow_path(struct dspk__cache *c) {
  struct stat sb;
  char warn[1024] = "", line[1400];
  sqlite3 *db = NULL;
  if (atomic_load(&c->in_memory) && c->busy_retry) {
    retry_busy(c);
    return;
  }
  if (atomic_load(&c->in_memory) || !c->have_id)
    return;
  int gone = stat(c->path, &sb) != 0;
  if (gone && errno != ENOENT && errno != ENOTDIR)
    return; /* cannot tell (EACCES, ...): keep the file that is open */
  if (!gone && sb.st_dev == c->dev && sb.st_ino == c->ino)
    return;
  drop_side_files(c);
  /* A put waits no longer than the writes do: a file locked at the path
   * now is retried at the next put (retry_busy). */
  int busy_ms = c->busy_ms;
  c->busy_ms = c->write_ms;
  int r = open_file(c, 0, &db, warn, sizeof warn);
  c->busy_ms = busy_ms;
  if (r == 0) {
    remember_file(c);
    set_write_wait(c, db);
    snprintf(line, sizeof line, "cache file %s %s; %s", c->path, GONE_WHY(gone),
             warn[0] ? warn
             : gone  ? "made a new one at that path"
                     : "now using the cache file at that path");
  } else {
    char why[512];
    if (r < 0 || try_open(":memory:", c->busy_ms, &db, why, sizeof why) !=
                     OPEN_OK) {
      /* Nothing better: keep writing where it did, and do not ask again. */
      c->have_id = 0;
      snprintf(line, sizeof line,
               "cache file %s %s, and the path cannot be opened again; what is "
               "stored from now on is lost at exit", c->path, GONE_WHY(gone));
      goto tell;
    }
    atomic_store(&c->in_memory, 1);
    snprintf(line, sizeof line, "cache file %s %s; %s", c->path, GONE_WHY(gone), warn);
  }
  /* SQLite neither checkpoints into a moved file nor deletes its -wal and
   * -shm by name when closing it (and drop_side_files removed those), so
   * whatever is at the path now is safe. */
  sqlite3_close_v2(c->db);
  c->db = db;
tell:
  if (c->notice)
    c->notice(c->notice_ud, line);
}

/* See cache.h. */
char *dspk__cache_default_path(void) { return default_path(); }

void dspk__cache_close(struct dspk__cache *c) {
  if (!c)
    return;
  (void)flush_used(c, 0);
  sqlite3_close_v2(c->db);
  pthread_mutex_destroy(&c->mu);
  free(c->path);
  free(c);
}

/* See cache.h. */
const char *dspk__cache_path(const struct dspk__cache *c) {
  return dspk__cache_in_memory(c) ? ":memory:" : c->path;
}

/* See cache.h. */
int dspk__cache_in_memory(const struct dspk__cache *c) {
  return atomic_load(&((struct dspk__cache *)c)->in_memory);
}

/* See cache.h. */
int dspk__cache_waiting_for_file(struct dspk__cache *c) {
  int w;
  if (!c)
    return 0;
  pthread_mutex_lock(&c->mu);
  w = atomic_load(&c->in_memory) && c->busy_retry;
  pthread_mutex_unlock(&c->mu);
  return w;
}

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

/* Writes the memo uses kept by note_used (with the mutex held): each
 * entry's hits + n, its last_used and a new tick, in the order the entries
 * were last used, so the most recently used one gets the highest tick.
 * Inside the caller's write transaction when in_txn, else in one of its
 * own.  Best effort, like touch(): what a busy or full file refuses only
 * loses recency, and is dropped (an entry evicted or cleared meanwhile
 * matches no row).  Returns an sqlite rc (in_txn: the caller's transaction
 * must be rolled back on an error). */
static int flush_used(struct dspk__cache *c, int in_txn) {
  static const char *const sql[DSPK__CACHE_NKINDS] = {
      "UPDATE kernels SET hits = hits + ?1, last_used = max(last_used, ?2), tick = ?3"
      " WHERE key = ?4",
      "UPDATE autotune SET hits = hits + ?1, last_used = max(last_used, ?2), tick = ?3"
      " WHERE key = ?4",
      "UPDATE blobs SET hits = hits + ?1, last_used = max(last_used, ?2), tick = ?3"
      " WHERE name = ?4"};
  sqlite3_stmt *st[DSPK__CACHE_NKINDS] = {NULL};
  int rc = SQLITE_OK;
  if (c->nused == 0)
    return SQLITE_OK;
  if (!in_txn && (rc = begin_write(c->db)) != SQLITE_OK)
    goto out;
  for (int i = 0; i < c->nused; i++) {
    struct used *u = &c->used[i];
    if (!st[u->kind] &&
        (rc = sqlite3_prepare_v2(c->db, sql[u->kind], -1, &st[u->kind], NULL)) != SQLITE_OK)
      goto out;
    int64_t t = next_tick(c->db);
    if (t < 0) {
      rc = (int)-t;
      goto out;
    }
    sqlite3_reset(st[u->kind]);
    sqlite3_bind_int64(st[u->kind], 1, (int64_t)u->hits);
    sqlite3_bind_int64(st[u->kind], 2, u->last_used);
    sqlite3_bind_int64(st[u->kind], 3, t);
    sqlite3_bind_text(st[u->kind], 4, u->key, -1, SQLITE_STATIC);
    if ((rc = sqlite3_step(st[u->kind])) != SQLITE_DONE)
      goto out;
  }
  rc = SQLITE_OK;
  if (!in_txn)
    rc = exec(c->db, "COMMIT");
out:
  for (int k = 0; k < DSPK__CACHE_NKINDS; k++)
    sqlite3_finalize(st[k]);
  if (rc != SQLITE_OK && !in_txn)
    rollback(c->db);
  for (int i = 0; i < c->nused; i++)
    free(c->used[i].key);
  c->nused = 0;
  return rc;
}

/* The most bytes of entries one client's owner (a uid's kernels) may
 * hold: a quarter of max_bytes, so that one user's kernels cannot evict
 * everyone else's. */
static uint64_t owner_share(const struct dspk__cache *c) { return c->max_bytes / 4; }

/* Deletes owner's least recently used kernels (inside the caller's write
 * transaction) until they hold at most owner_share bytes.  Returns an
 * sqlite rc. */
static int evict_owner(struct dspk__cache *c, const char *owner) {
  sqlite3_stmt *tot = NULL, *old = NULL, *del = NULL;
  int rc = sqlite3_prepare_v2(c->db, "SELECT total(size) FROM kernels WHERE owner = ?1", -1,
                              &tot, NULL);
  if (rc == SQLITE_OK)
    rc = sqlite3_prepare_v2(c->db, "SELECT rowid, size FROM kernels WHERE owner = ?1"
                                   " ORDER BY tick LIMIT 64", -1, &old, NULL);
  if (rc == SQLITE_OK)
    rc = sqlite3_prepare_v2(c->db, "DELETE FROM kernels WHERE rowid = ?1", -1, &del, NULL);
  if (rc != SQLITE_OK)
    goto out;
  sqlite3_bind_text(tot, 1, owner, -1, SQLITE_STATIC);
  sqlite3_bind_text(old, 1, owner, -1, SQLITE_STATIC);
  if ((rc = sqlite3_step(tot)) != SQLITE_ROW)
    goto out;
  double total = sqlite3_column_double(tot, 0);
  rc = SQLITE_OK;
  while (total > (double)owner_share(c)) {
    int64_t victims[64];
    double sizes[64];
    int n = 0;
    sqlite3_reset(old);
    while ((rc = sqlite3_step(old)) == SQLITE_ROW && n < 64) {
      victims[n] = sqlite3_column_int64(old, 0);
      sizes[n++] = sqlite3_column_double(old, 1);
    }
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
      goto out;
    rc = SQLITE_OK;
    sqlite3_reset(old);
    if (n == 0)
      break;
    for (int i = 0; i < n && total > (double)owner_share(c); i++) {
      sqlite3_reset(del);
      sqlite3_bind_int64(del, 1, victims[i]);
      if ((rc = sqlite3_step(del)) != SQLITE_DONE)
        goto out;
      rc = SQLITE_OK;
      total -= sizes[i];
      c->count[DSPK__CACHE_KERNELS].evictions++;
    }
  }
out:
  sqlite3_finalize(tot);
  sqlite3_finalize(old);
  sqlite3_finalize(del);
  return rc;
}

/* Deletes least recently used entries (inside the caller's write
 * transaction) until the total size is at most max_bytes: for a put of a
 * client's kernel (owner not NULL) first that owner's beyond its share,
 * then clients' kernels only (a user's put never evicts what the daemon
 * stored for itself: tuning decisions, its own kernels, blobs).  Returns
 * an sqlite rc. */
static int evict(struct dspk__cache *c, const char *owner) {
  sqlite3_stmt *tot = NULL, *old = NULL, *del[DSPK__CACHE_NKINDS] = {0};
  static const char *const del_sql[DSPK__CACHE_NKINDS] = {
      "DELETE FROM kernels WHERE rowid = ?1",
      "DELETE FROM autotune WHERE rowid = ?1",
      "DELETE FROM blobs WHERE rowid = ?1"};
  int rc = owner ? evict_owner(c, owner) : SQLITE_OK;
  if (rc != SQLITE_OK)
    return rc;
  rc = sqlite3_prepare_v2(
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
      owner ? "SELECT 0, rowid, size, tick FROM kernels WHERE owner IS NOT NULL"
              " ORDER BY 4 LIMIT 64"
            : "SELECT 0, rowid, size, tick FROM kernels UNION ALL"
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

/* A put refused before the database because the entry alone is larger than
 * what it may take (bound: the cache's max_bytes, or a client's share of
 * it): never kept however much is evicted, so counted with the failed puts
 * and told through opts.put_result, so that a bound too small for the
 * entries is seen (it was a silent miss each time).  DSPK_ELIMIT. */
static int put_too_large(struct dspk__cache *c, int kind, uint64_t size, uint64_t bound,
                         bool share) {
  char why[160];
  c->count[kind].put_errors++;
  snprintf(why, sizeof why, "the entry (%llu bytes) is larger than %s (%llu bytes)",
           (unsigned long long)size,
           share ? "a client's share of the cache's size bound" : "the cache's size bound",
           (unsigned long long)bound);
  pthread_mutex_lock(&c->mu);
  if (c->put_result)
    c->put_result(c->notice_ud, kind, DSPK_ELIMIT, why);
  pthread_mutex_unlock(&c->mu);
  return DSPK_ELIMIT;
}

/* Finishes a put: runs the prepared insert (whose ?2 is the tick) inside a
 * write transaction together with the tick bump and the eviction.  Takes
 * ownership of st.  Called with the mutex held.  Returns 0 or a dspk_errno. */
/* Records a put's failure rc and the system's reason under it, before a
 * rollback replaces them.  Called with the mutex held. */
static void put_failed(struct dspk__cache *c, int rc) {
  c->put_rc = rc;
  sys_reason(c->db, rc, c->put_sys, sizeof c->put_sys);
}

/* Called with the mutex held at the end of every put that reached the
 * database: counts a failure and tells opts.put_result about it, and about
 * the first success after failures. */
static void note_put(struct dspk__cache *c, int kind, int err) {
  if (err < 0) {
    char detail[400];
    c->count[kind].put_errors++;
    c->put_failing = 1;
    snprintf(detail, sizeof detail, "%s%s%s", sqlite3_errstr(c->put_rc),
             c->put_sys[0] ? ": " : "", c->put_sys);
    if (c->put_result)
      c->put_result(c->notice_ud, kind, err, detail);
  } else if (c->put_failing) {
    c->put_failing = 0;
    if (c->put_result)
      c->put_result(c->notice_ud, kind, 0, "");
  }
}

static int put_commit(struct dspk__cache *c, int kind, sqlite3_stmt *st,
                      int tick_param, const char *owner) {
  int rc = begin_write(c->db);
  if (rc != SQLITE_OK)
    goto out;
  /* The memo's uses first, so the eviction below sees them (and the new
   * entry still gets the highest tick).  A failure here only loses them. */
  if (c->nused && flush_used(c, 1) != SQLITE_OK) {
    rollback(c->db);
    if ((rc = begin_write(c->db)) != SQLITE_OK)
      goto out;
  }
  int64_t t = next_tick(c->db);
  if (t < 0) {
    rc = (int)-t;
    goto out;
  }
  sqlite3_bind_int64(st, tick_param, t);
  rc = sqlite3_step(st);
  if (rc != SQLITE_DONE)
    goto out;
  rc = evict(c, owner);
  if (rc != SQLITE_OK)
    goto out;
  rc = exec(c->db, "COMMIT");
  if (rc == SQLITE_OK)
    c->count[kind].puts++;
out:
  sqlite3_finalize(st);
  if (rc != SQLITE_OK && rc != SQLITE_DONE) {
    put_failed(c, rc); /* before the rollback resets the connection's message */
    rollback(c->db);
  }
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
  /* The name column: the kernel's name, and for a client's kernel its
   * owner too ("raw for uid 1000"), so that the SQL match compares the
   * owner as it does every other field. */
  const char *name;
  char owned[192];
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
  out->name = k->name;
  if (k->owner) { /* the daemon's own kernels keep the keys they had */
    dspk__hash_str(&h, k->owner);
    snprintf(out->owned, sizeof out->owned, "%s for %s", k->name ? k->name : "", k->owner);
    out->name = out->owned;
  }
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

/* ---- damaged entries ------------------------------------------------------ */

#define SUM_WHY "its checksum does not match its contents (damaged in the file)"

/* 1 when the checksum in column 1 of st's row (kernels, blobs; autotune:
 * column 1 too) matches the entry of kind with key that holds a[0..alen)
 * (autotune: the winner a and the timings b). */
static int sum_ok(sqlite3_stmt *st, int kind, const char *key, const void *a, size_t alen,
                  const char *b) {
  char sum[DSPK__HASH_HEX];
  const char *stored = (const char *)sqlite3_column_text(st, 1);
  entry_sum(kind, key, a, alen, b, sum);
  return stored && strcmp(stored, sum) == 0;
}

/* Deletes the entry of kind whose key column (a blob's name) is key, found
 * damaged or unusable (with the mutex held; the caller counts the miss), and told to
 * opts.dropped with what (the entry, for the log) and why.  Best effort: a
 * row a busy file keeps is found damaged again next time, and replaced by
 * the next put. */
static void drop_row(struct dspk__cache *c, int kind, const char *key, const char *what,
                     const char *why) {
  static const char *const sql[DSPK__CACHE_NKINDS] = {
      "DELETE FROM kernels WHERE key = ?1", "DELETE FROM autotune WHERE key = ?1",
      "DELETE FROM blobs WHERE name = ?1"};
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(c->db, sql[kind], -1, &st, NULL) == SQLITE_OK) {
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    (void)sqlite3_step(st); /* autocommit: waits as every write does (busy_wait) */
  }
  sqlite3_finalize(st);
  /* Its uses kept for flush_used would match no row: forget them. */
  for (int i = 0; i < c->nused; i++)
    if (c->used[i].kind == kind && strcmp(c->used[i].key, key) == 0) {
      free(c->used[i].key);
      memmove(&c->used[i], &c->used[i + 1], (size_t)(c->nused - i - 1) * sizeof c->used[0]);
      c->nused--;
      break;
    }
  if (c->dropped)
    c->dropped(c->notice_ud, kind, what, why);
}

/* A kernel entry for the log: "NAME for uid N on DEVICE (BACKEND)". */
static void kernel_what(const struct dspk__kernel_key *k, const struct kkey *kk, char *buf,
                        size_t len) {
  snprintf(buf, len, "%s on %s (%s)", kk->name ? kk->name : "(no name)",
           k->dev.name ? k->dev.name : "?", k->dev.backend ? k->dev.backend : "?");
}

/* A decision for the log: "OP SHAPE DTYPES on DEVICE (BACKEND)". */
static void tune_what(const struct dspk__tune_key *k, char *buf, size_t len) {
  snprintf(buf, len, "%s %s %s on %s (%s)", k->op ? k->op : "?", k->shape ? k->shape : "?",
           k->dtypes ? k->dtypes : "?", k->dev.name ? k->dev.name : "?",
           k->dev.backend ? k->dev.backend : "?");
}

/* An entry a get served that the caller could not use: no longer a hit but
 * a miss, and deleted. */
static int drop_served(struct dspk__cache *c, int kind, const char *key, const char *what,
                       const char *why) {
  pthread_mutex_lock(&c->mu);
  if (c->count[kind].hits > 0)
    c->count[kind].hits--;
  c->count[kind].misses++;
  drop_row(c, kind, key, what, why);
  pthread_mutex_unlock(&c->mu);
  return 0;
}

/* See cache.h. */
int dspk__cache_kernel_drop(struct dspk__cache *c, const struct dspk__kernel_key *k,
                            const char *why) {
  struct kkey kk;
  char what[320];
  if (!c || !k || (!k->source && k->source_len))
    return DSPK_EINVAL;
  kernel_key(k, &kk);
  kernel_what(k, &kk, what, sizeof what);
  return drop_served(c, DSPK__CACHE_KERNELS, kk.key, what, why ? why : "unusable");
}

/* See cache.h. */
int dspk__cache_tune_drop(struct dspk__cache *c, const struct dspk__tune_key *k,
                          const char *why) {
  char key[DSPK__HASH_HEX], cands[17], what[320];
  if (!c || !k)
    return DSPK_EINVAL;
  tune_key(k, key, cands);
  tune_what(k, what, sizeof what);
  return drop_served(c, DSPK__CACHE_AUTOTUNE, key, what, why ? why : "unusable");
}

/* See cache.h. */
int dspk__cache_blob_drop(struct dspk__cache *c, const char *name, const char *why) {
  if (!c || !name)
    return DSPK_EINVAL;
  return drop_served(c, DSPK__CACHE_BLOBS, name, name, why ? why : "unusable");
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
  bind_str(st, 9, kk->name);
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
  int rc = sqlite3_prepare_v2(c->db, "SELECT bin, sum FROM kernels WHERE"
                              KERNEL_MATCH, -1, &st, NULL);
  if (rc != SQLITE_OK) {
    err = map_rc(rc);
    goto out;
  }
  bind_kernel(st, k, &kk);
  err = fetch_blob(st, bin, len);
  if (err == 0 && !sum_ok(st, DSPK__CACHE_KERNELS, kk.key, *bin, *len, NULL)) {
    char what[320];
    kernel_what(k, &kk, what, sizeof what);
    sqlite3_finalize(st);
    st = NULL;
    free(*bin);
    *bin = NULL;
    drop_row(c, DSPK__CACHE_KERNELS, kk.key, what, SUM_WHY);
    err = DSPK_ENOENT;
  }
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
                  slen(k->compiler_version) + slen(kk.name) +
                  slen(k->options) + 2 * 32;
  if (size > (k->owner ? owner_share(c) : c->max_bytes))
    return put_too_large(c, DSPK__CACHE_KERNELS, size,
                         k->owner ? owner_share(c) : c->max_bytes, k->owner != 0);
  pthread_mutex_lock(&c->mu);
  follow_path(c);
  int rc = sqlite3_prepare_v2(
      c->db,
      "INSERT OR REPLACE INTO kernels(key, tick, backend, device, arch, uuid,"
      " driver, compiler, compiler_version, name, source_hash, options, bin,"
      " size, created, last_used, hits, owner, sum)"
      " VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14,"
      " ?15, ?15, 0, ?16, ?17)",
      -1, &st, NULL);
  if (rc != SQLITE_OK) {
    put_failed(c, rc);
    err = map_rc(rc);
    goto out;
  }
  sqlite3_bind_text(st, 1, kk.key, -1, SQLITE_STATIC);
  bind_dev(st, 3, &k->dev);
  bind_str(st, 8, k->compiler);
  bind_str(st, 9, k->compiler_version);
  bind_str(st, 10, kk.name);
  sqlite3_bind_text(st, 11, kk.src, -1, SQLITE_STATIC);
  bind_str(st, 12, k->options);
  sqlite3_bind_blob64(st, 13, len ? bin : "", len, SQLITE_STATIC);
  sqlite3_bind_int64(st, 14, (int64_t)size);
  sqlite3_bind_int64(st, 15, now_s());
  bind_str(st, 16, k->owner);
  char sum[DSPK__HASH_HEX];
  entry_sum(DSPK__CACHE_KERNELS, kk.key, bin, len, NULL, sum);
  sqlite3_bind_text(st, 17, sum, -1, SQLITE_STATIC);
  err = put_commit(c, DSPK__CACHE_KERNELS, st, 2, k->owner);
out:
  note_put(c, DSPK__CACHE_KERNELS, err);
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
  snprintf(sql, sizeof sql, "SELECT %s, sum, winner, timings FROM autotune WHERE" TUNE_MATCH,
           col);
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
  if (!sum_ok(st, DSPK__CACHE_AUTOTUNE, key, sqlite3_column_text(st, 2), 0,
              (const char *)sqlite3_column_text(st, 3))) {
    char what[320];
    tune_what(k, what, sizeof what);
    sqlite3_finalize(st);
    st = NULL;
    drop_row(c, DSPK__CACHE_AUTOTUNE, key, what, SUM_WHY);
    err = DSPK_ENOENT;
    if (count)
      c->count[DSPK__CACHE_AUTOTUNE].misses++;
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
    return put_too_large(c, DSPK__CACHE_AUTOTUNE, size, c->max_bytes, false);
  pthread_mutex_lock(&c->mu);
  follow_path(c);
  int rc = sqlite3_prepare_v2(
      c->db,
      "INSERT OR REPLACE INTO autotune(key, tick, backend, device, arch, uuid,"
      " driver, op, shape, dtypes, layout, cands_hash, winner, timings, size,"
      " created, last_used, hits, sum)"
      " VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14,"
      " ?15, ?16, ?16, 0, ?17)",
      -1, &st, NULL);
  if (rc != SQLITE_OK) {
    put_failed(c, rc);
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
  char sum[DSPK__HASH_HEX];
  entry_sum(DSPK__CACHE_AUTOTUNE, key, winner, 0, timings, sum);
  sqlite3_bind_text(st, 17, sum, -1, SQLITE_STATIC);
  err = put_commit(c, DSPK__CACHE_AUTOTUNE, st, 2, NULL);
out:
  note_put(c, DSPK__CACHE_AUTOTUNE, err);
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
  int rc = sqlite3_prepare_v2(c->db, "SELECT data, sum FROM blobs WHERE name = ?1",
                              -1, &st, NULL);
  if (rc != SQLITE_OK) {
    err = map_rc(rc);
    goto out;
  }
  sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
  err = fetch_blob(st, data, len);
  if (err == 0 && !sum_ok(st, DSPK__CACHE_BLOBS, name, *data, *len, NULL)) {
    sqlite3_finalize(st);
    st = NULL;
    free(*data);
    *data = NULL;
    drop_row(c, DSPK__CACHE_BLOBS, name, name, SUM_WHY);
    err = DSPK_ENOENT;
  }
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
    return put_too_large(c, DSPK__CACHE_BLOBS, size, c->max_bytes, false);
  pthread_mutex_lock(&c->mu);
  follow_path(c);
  int rc = sqlite3_prepare_v2(
      c->db,
      "INSERT OR REPLACE INTO blobs(name, tick, data, size, created,"
      " last_used, hits, sum) VALUES(?1, ?2, ?3, ?4, ?5, ?5, 0, ?6)",
      -1, &st, NULL);
  if (rc != SQLITE_OK) {
    put_failed(c, rc);
    err = map_rc(rc);
    goto out;
  }
  sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
  sqlite3_bind_blob64(st, 3, len ? data : "", len, SQLITE_STATIC);
  sqlite3_bind_int64(st, 4, (int64_t)size);
  sqlite3_bind_int64(st, 5, now_s());
  char sum[DSPK__HASH_HEX];
  entry_sum(DSPK__CACHE_BLOBS, name, data, len, NULL, sum);
  sqlite3_bind_text(st, 6, sum, -1, SQLITE_STATIC);
  err = put_commit(c, DSPK__CACHE_BLOBS, st, 2, NULL);
out:
  note_put(c, DSPK__CACHE_BLOBS, err);
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
  (void)flush_used(c, 0); /* stored_hits and the ticks count the memo's uses */
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
    s.kind[k].put_errors = c->count[k].put_errors;
    sqlite3_finalize(st);
    st = NULL;
  }
  s.max_bytes = c->max_bytes;
  s.in_memory = atomic_load(&c->in_memory);
  if (!s.in_memory) {
    struct stat sb;
    char wal[PATH_MAX + 8];
    /* The file SQLite opened: a symbolic link's target, beside which it
     * keeps the log (not beside the link). */
    const char *file = sqlite3_db_filename(c->db, "main");
    if (!file || !*file)
      file = c->path;
    if (stat(file, &sb) == 0)
      s.file_bytes = (uint64_t)sb.st_size;
    /* with its write-ahead log, where new entries are until a checkpoint */
    if ((size_t)snprintf(wal, sizeof wal, "%s-wal", file) < sizeof wal &&
        stat(wal, &sb) == 0)
      s.file_bytes += (uint64_t)sb.st_size;
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
int dspk__cache_clear(struct dspk__cache *c, unsigned mask, char *why, size_t whylen) {
  const char *step = "BEGIN IMMEDIATE";
  char sql[64];
  int rc;
  if (why && whylen)
    why[0] = '\0';
  if (!c || (mask & ~DSPK__CACHE_ALL))
    return DSPK_EINVAL;
  pthread_mutex_lock(&c->mu);
  rc = begin_write(c->db);
  if (rc != SQLITE_OK)
    goto out;
  for (int k = 0; k < DSPK__CACHE_NKINDS; k++) {
    if (!(mask & DSPK__CACHE_MASK(k)))
      continue;
    snprintf(sql, sizeof sql, "DELETE FROM %s", kind_table[k]);
    step = sql;
    rc = exec(c->db, sql);
    if (rc != SQLITE_OK)
      goto out;
  }
  step = "COMMIT";
  rc = exec(c->db, "COMMIT");
  if (rc == SQLITE_OK && (mask & DSPK__CACHE_MASK(DSPK__CACHE_AUTOTUNE)))
    atomic_store(&c->epoch, atomic_fetch_add(&epoch_source, 1) + 1);
  if (rc == SQLITE_OK)
    exec(c->db, "PRAGMA incremental_vacuum"); /* best effort */
out:
  if (rc != SQLITE_OK) {
    /* SQLite's message (and the system's reason under it: ENOSPC, EFBIG,
     * EIO) before the rollback replaces them. */
    char sys[320];
    sys_reason(c->db, rc, sys, sizeof sys);
    if (why && whylen)
      snprintf(why, whylen, "%s: %s%s%s%s", step, sqlite3_errmsg(c->db), sys[0] ? " (" : "",
               sys, sys[0] ? ")" : "");
    rollback(c->db);
  }
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
    out[k].put_errors = atomic_load(&c->count[k].put_errors);
  }
}

/* Counts a use of the entry of kind with key (a row's key, or a blob's
 * name) served from a caller's memo: a hit now, written by flush_used. */
static void note_used(struct dspk__cache *c, int kind, const char *key) {
  struct used u;
  int i;
  pthread_mutex_lock(&c->mu);
  c->count[kind].hits++;
  for (i = 0; i < c->nused && (c->used[i].kind != kind || strcmp(c->used[i].key, key) != 0);
       i++)
    ;
  if (i == c->nused && c->nused == USED_MAX) {
    (void)flush_used(c, 0); /* one transaction per USED_MAX distinct entries */
    i = 0;
  }
  if (i < c->nused) {
    u = c->used[i];
  } else if (!(u.key = strdup(key))) {
    pthread_mutex_unlock(&c->mu); /* best effort: only this use's recency is lost */
    return;
  } else {
    u.kind = kind;
    u.hits = 0;
  }
  u.hits++;
  u.last_used = now_s();
  /* Kept in order of last use: the most recent last. */
  memmove(&c->used[i], &c->used[i + 1], (size_t)(c->nused - (i < c->nused) - i) * sizeof u);
  if (i < c->nused)
    c->nused--;
  c->used[c->nused++] = u;
  pthread_mutex_unlock(&c->mu);
}

/* See cache.h. */
void dspk__cache_tune_used(struct dspk__cache *c, const struct dspk__tune_key *k) {
  char key[DSPK__HASH_HEX], cands[17];
  if (!c || !k)
    return;
  tune_key(k, key, cands);
  note_used(c, DSPK__CACHE_AUTOTUNE, key);
}

/* See cache.h. */
void dspk__cache_kernel_id(const struct dspk__kernel_key *k, char id[DSPK__HASH_HEX]) {
  struct kkey kk;
  kernel_key(k, &kk);
  memcpy(id, kk.key, sizeof kk.key);
}

/* See cache.h. */
void dspk__cache_kernel_used(struct dspk__cache *c, const char *id) {
  if (c && id && id[0])
    note_used(c, DSPK__CACHE_KERNELS, id);
}

/* See cache.h. */
void dspk__cache_blob_used(struct dspk__cache *c, const char *name) {
  if (c && name)
    note_used(c, DSPK__CACHE_BLOBS, name);
}
