/*
 * The persistent cache: one SQLite file that keeps what is expensive to
 * make (compiled kernels, autotune decisions, named blobs such as FFTW
 * wisdom or Vulkan pipeline-cache data) across daemon restarts.
 *
 * Keys.  Every lookup key is a 128-bit hash over all the fields that decide
 * whether a stored entry is still valid (kernel source after code
 * generation, compile options, compiler name and version, the device's
 * backend, name, arch, UUID and driver version; for autotune decisions the
 * op, shape class, dtypes, layout, device and candidate list).  A change of
 * any field is therefore a miss, never a stale hit.  The fields are stored
 * beside the entry as well, for stats and debugging, and compared again on
 * a hit so that even a hash collision cannot serve a wrong entry.
 *
 * Threads.  Every function may be called from any thread at once: the
 * cache holds one SQLite connection behind a mutex, and each call is a
 * short transaction of its own.  No transaction is ever held across device
 * work: get, compile/tune, then put.  Several processes may share one file
 * (WAL mode and a busy timeout); once open, a write waits only briefly for
 * another process's lock (opts.write_timeout_ms) and is given up, so that
 * a lock held long elsewhere never holds up the callers (runners).
 *
 * Errors.  Functions return 0 or a negative dspk_errno (DSPK_ENOENT for a
 * miss) and never print or log; warnings meant for the daemon's log come
 * back as strings from dspk__cache_open().
 */
#ifndef DSPK_CACHE_CACHE_H
#define DSPK_CACHE_CACHE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "dspk/errors.h"

struct dspk__cache;

/* ---- hashing: one helper every backend uses for keys ------------------- */

/* A 128-bit FNV-1a hash state.  Fields are fed length-prefixed, so
 * ("ab","c") and ("a","bc") differ, and a NULL string differs from "". */
struct dspk__hash {
  uint64_t hi, lo;
};
#define DSPK__HASH_HEX 33 /* 32 hex digits + NUL */

void dspk__hash_init(struct dspk__hash *h);
/* Feeds one field: its length (8 bytes) and then its bytes. */
void dspk__hash_field(struct dspk__hash *h, const void *p, size_t n);
/* Feeds a NUL-terminated string as one field; NULL is fed as a distinct
 * marker. */
void dspk__hash_str(struct dspk__hash *h, const char *s);
void dspk__hash_u64(struct dspk__hash *h, uint64_t v);
/* Writes 32 lowercase hex digits and a NUL into hex[DSPK__HASH_HEX]. */
void dspk__hash_hex(const struct dspk__hash *h, char hex[DSPK__HASH_HEX]);
/* Convenience: the 64-bit fold (hi ^ lo) of the hash of one buffer. */
uint64_t dspk__hash64(const void *p, size_t n);

/* ---- opening ------------------------------------------------------------ */

struct dspk__cache_opts {
  uint64_t max_bytes;  /* size bound of all entries; 0: 256 MiB */
  int busy_timeout_ms; /* at open, wait for another writer; 0: 5000 ms */
  /* Once open, each write (a put, a hit's recency, a clear) waits at most
   * this for another process's lock, and then fails with DSPK_EBUSY (a
   * put: the entry is not kept); for 1 s after such a failure the writes
   * try the lock once without waiting.  0: 100 ms. */
  int write_timeout_ms;
  int no_fallback;     /* 1: an unusable file is an error, no in-memory cache */
  /* Optional: receives one line for the log when the cache changes file
   * while open (its file was deleted or replaced: see dspk__cache_open).
   * Called from the thread whose put noticed it, with the cache's lock
   * held: it must not call into the cache. */
  void (*notice)(void *ud, const char *line);
  void *notice_ud;
  /* Optional: told about every put (kernel, tune, blob) that failed in the
   * database (err a negative dspk_errno, detail SQLite's message, e.g.
   * "database or disk is full") or was refused for an entry larger than it
   * may take (DSPK_ELIMIT, detail "the entry (N bytes) is larger than the
   * cache's size bound (M bytes)"), and once about the first put that works
   * after failures in the database (err 0, detail "").  kind is an enum dspk__cache_kind;
   * ud is notice_ud.  Same thread and lock rules as notice.  The puts also
   * return the error, and dspk__cache_counts counts them (put_errors). */
  void (*put_result)(void *ud, int kind, int err, const char *detail);
  /* Optional: told about every entry dropped (deleted) because it could not
   * be used: its checksum did not match what a get read (the file was
   * damaged: why "its checksum does not match its contents (damaged in
   * the file)"), or a caller found what a get served unusable
   * (dspk__cache_kernel_drop and the others: why is the caller's).  kind is
   * an enum dspk__cache_kind, what names the entry for a log ("ramp for uid
   * 1000 on llvmpipe (vulkan)", a decision's op, shape and dtypes, a blob's
   * name); ud is notice_ud.  Same thread and lock rules as notice. */
  void (*dropped)(void *ud, int kind, const char *what, const char *why);
};

/*
 * Opens (creating it and its directories) the cache file at path, or at
 * $XDG_CACHE_HOME/dspk/cache.db (~/.cache/dspk/cache.db) when path is NULL.
 * ":memory:" opens a private in-memory cache.  opts may be NULL.
 *
 * What the file is is decided before anything in it is changed.  A missing
 * or empty file (an SQLite database without tables and user_version 0)
 * becomes a dspk cache, marked with PRAGMA application_id; a dspk cache
 * (marked, or made before caches were marked and recognised by exactly the
 * tables of its schema version) is used, migrated forward if older.
 * Another program's SQLite database, and a dspk cache of a newer schema,
 * are left alone, byte for byte (no -wal or -shm file is made beside them),
 * and so are a file another process holds an flock(2) on (a lock file:
 * SQLite itself never takes one) and one of the files SQLite keeps beside
 * another database (by its first bytes: a write-ahead log, a rollback
 * journal, a WAL index).
 * A corrupt file (not a database: a non-empty file whose first 16 bytes
 * are not SQLite's header, or PRAGMA quick_check fails) and a
 * marked cache whose tables are not those of its version are renamed to
 * "<path>.corrupt-<unixtime>" (or "<path>.corrupt-<unixtime>.N", N from
 * 1, when that name is taken: a file kept aside is never replaced) and a
 * new one is made (path a symbolic link: its target is renamed and
 * rebuilt, the link stays), unless another process holds a lock (flock(2)
 * or fcntl(2)) on it: a file in use is never moved aside, and is left
 * alone; a location that cannot be written, a file left alone,
 * or one that cannot be rebuilt falls back to an in-memory cache.  A file
 * another process keeps locked for longer than the busy timeout falls back
 * to an in-memory cache too, but only until it is free: each put first
 * tries the file again (waiting at most 100 ms for the lock), and once it
 * opens, what was stored in memory meanwhile is copied into it and
 * opts->notice is told once.  In those cases the call succeeds and writes
 * one line into warn (for the daemon to log once) saying what happened;
 * otherwise warn is set to "".  warn may be NULL.
 *
 * A location another user could change is left alone too (an in-memory
 * cache, warn naming what and the fix): a symbolic link at path not owned
 * by root or this process's user, the directory holding path (or the
 * link's target) owned by another user or writable by group or others
 * without the sticky bit, the file or its -wal, -shm or -journal owned by
 * another user or writable by group or others, a companion that is a
 * symbolic link (dspk__trust_stat).  A file this call makes is mode 0600.
 *
 * While open, each put first checks (one stat) that path still names the
 * open file; when it was deleted or replaced, the old file's -wal and -shm
 * (still at the path) are checkpointed into it and removed, when they are
 * still the ones the open connection made, so that they are never applied
 * to the file at the path; then the path is opened again by the same rules
 * (a new cache where nothing is left) and opts->notice is told once.
 *
 * Returns 0 and writes *out (the caller closes it with dspk__cache_close),
 * or a negative dspk_errno (DSPK_EIO when no_fallback and the file is
 * unusable or left alone, DSPK_EBUSY when no_fallback and it is locked,
 * DSPK_ENOMEM).
 */
int dspk__cache_open(const char *path, const struct dspk__cache_opts *opts,
                     struct dspk__cache **out, char *warn, size_t warnlen);
/* The file dspk__cache_open(NULL, ...) opens: $XDG_CACHE_HOME/dspk/cache.db
 * or ~/.cache/dspk/cache.db, malloc'd (the caller frees it); NULL when no
 * home is known or out of memory. */
char *dspk__cache_default_path(void);
/* ---- files other users could change (cache/trust.c) -------------------- */

struct stat;
/* 0 when st (what lstat or fstat said of a file, a symbolic link or a
 * directory) is safe from every user but owner (and root, when root_ok):
 * owned by one of them, and not writable by group or others (a directory
 * may be, with the sticky bit: then no one else can rename or remove what
 * is in it; a link's own mode means nothing).  Else -1 with why, one
 * phrase: "owned by uid 65534, not by [root or ]<whose>uid 0", "writable
 * by group or others (mode 0666)", "a directory writable by group or
 * others without the sticky bit (mode 0777: ...)".  whose: NULL or words
 * before "uid" ("dspkd's "). */
int dspk__trust_stat(const struct stat *st, uid_t owner, int root_ok, const char *whose,
                     char *why, size_t len);
/* The same for the directory that holds path (its name up to the last
 * '/', "." without one), written into dir.  0, or -1 with why (a directory
 * that cannot be looked at says so). */
int dspk__trust_dir_of(const char *path, uid_t owner, int root_ok, const char *whose,
                       char *dir, size_t dirlen, char *why, size_t len);

/* Closes the connection and frees the cache.  Accepts NULL. */
void dspk__cache_close(struct dspk__cache *c);
/* The file in use (":memory:" after a fallback, at open or later).  Owned
 * by the cache. */
const char *dspk__cache_path(const struct dspk__cache *c);
/* 1 when the cache lives in memory only (by request or after a fallback). */
int dspk__cache_in_memory(const struct dspk__cache *c);
/* 1 while the cache is in memory only because its file was locked at open
 * (each put tries the file again); 0 otherwise.  Call it where no put runs
 * at the same time (right after dspk__cache_open). */
int dspk__cache_waiting_for_file(struct dspk__cache *c);

/* ---- device identity ------------------------------------------------------ */

/* Who a kernel or a decision belongs to.  Every field is part of the key;
 * NULL is allowed for unknown fields (and differs from ""). */
struct dspk__cache_devid {
  const char *backend; /* "cuda", "vulkan", "cpu" */
  const char *name;    /* "NVIDIA H200" */
  const char *arch;    /* "sm_90", "x86_64" */
  const char *uuid;    /* device UUID, "" when unknown */
  const char *driver;  /* driver version */
};

/* ---- compiled kernels ----------------------------------------------------- */

struct dspk__kernel_key {
  struct dspk__cache_devid dev;
  const char *compiler;         /* "nvrtc", "glslang" */
  const char *compiler_version; /* "12.4.131" */
  const char *name;             /* entry point or kernel name (stats only,
                                   but part of the key too) */
  const void *source;           /* source after code generation */
  size_t source_len;
  const char *options;          /* compile options, as one string */
  const char *owner;            /* a client's kernel: whose ("uid 1000"), in
                                   the key only; NULL: the daemon's own,
                                   shared by every client */
};

/*
 * Looks the kernel up.  On a hit returns 0 and writes *bin (malloc'd, the
 * caller frees it) and *len, and counts the hit.  Returns DSPK_ENOENT on a
 * miss, or another negative dspk_errno.  An entry whose stored checksum
 * does not match what was read (the file was damaged) is never served: it
 * is deleted, told to opts.dropped, and the get is a miss (DSPK_ENOENT,
 * counted as one); the same holds for tune_get and blob_get.
 */
int dspk__cache_kernel_get(struct dspk__cache *c,
                           const struct dspk__kernel_key *k, void **bin,
                           size_t *len);
/* Stores (or replaces) the kernel's binary; bin is copied.  May evict least
 * recently used entries to stay under max_bytes.  Returns 0, DSPK_ELIMIT
 * when the entry alone exceeds max_bytes, or a negative dspk_errno. */
int dspk__cache_kernel_put(struct dspk__cache *c,
                           const struct dspk__kernel_key *k, const void *bin,
                           size_t len);

/* The kernel a get just served (0) could not be used (its binary is not
 * valid for the device: a validator or the driver refused it): deletes it
 * and counts that get as a miss rather than a hit, and tells opts.dropped
 * with why (one phrase, for the daemon's log).  The caller then makes the
 * kernel from its source as on a miss.  Returns 0 or a negative dspk_errno;
 * best effort (a busy file keeps the row; the next put replaces it). */
int dspk__cache_kernel_drop(struct dspk__cache *c, const struct dspk__kernel_key *k,
                            const char *why);

/* ---- autotune decisions --------------------------------------------------- */

struct dspk__tune_key {
  struct dspk__cache_devid dev;
  const char *op;      /* "fft", "fir", "gemm" */
  const char *shape;   /* shape class, e.g. "n=2^20,b=1" */
  const char *dtypes;  /* "c64" or "f32,f32" */
  const char *layout;  /* layout/alignment class, "" when irrelevant */
  uint64_t cands_hash; /* hash of the candidate-name list */
};

/* Looks the decision up.  On a hit returns 0 and copies the winner's name
 * into winner[len] (DSPK_ERANGE when it does not fit).  DSPK_ENOENT on a
 * miss. */
int dspk__cache_tune_get(struct dspk__cache *c, const struct dspk__tune_key *k,
                         char *winner, size_t len);
/* Stores the decision: the winner and every candidate's timings (any text,
 * JSON by convention: {"cand":[ns,...],...}; may be NULL).  Both copied. */
int dspk__cache_tune_put(struct dspk__cache *c, const struct dspk__tune_key *k,
                         const char *winner, const char *timings);
/* As dspk__cache_kernel_drop, for a decision a get served that names no
 * candidate of the caller's. */
int dspk__cache_tune_drop(struct dspk__cache *c, const struct dspk__tune_key *k,
                          const char *why);
/* Removes the decision (a winner failed at launch: re-tune).  Returns 0
 * whether or not it existed. */
int dspk__cache_tune_del(struct dspk__cache *c, const struct dspk__tune_key *k);
/* Copies the stored timings text of a decision into buf (NUL-terminated,
 * truncated to len).  DSPK_ENOENT on a miss.  For tests and debugging. */
int dspk__cache_tune_timings(struct dspk__cache *c,
                             const struct dspk__tune_key *k, char *buf,
                             size_t len);

/* ---- named blobs ---------------------------------------------------------- */

/* The caller puts the identity that makes a blob valid into its name, e.g.
 * "fftw-wisdom/f64/<cpu model>/<fftw version>" or
 * "vk-pipeline-cache/<pipelineCacheUUID>/<driver>". */
int dspk__cache_blob_get(struct dspk__cache *c, const char *name, void **data,
                         size_t *len); /* as kernel_get: *data malloc'd */
int dspk__cache_blob_put(struct dspk__cache *c, const char *name,
                         const void *data, size_t len);
/* As dspk__cache_kernel_drop, for a blob a get served that its user could
 * not take (FFTW refused the wisdom, VkFFT the plan). */
int dspk__cache_blob_drop(struct dspk__cache *c, const char *name, const char *why);

/* ---- stats and maintenance ------------------------------------------------ */

enum dspk__cache_kind {
  DSPK__CACHE_KERNELS = 0,
  DSPK__CACHE_AUTOTUNE = 1,
  DSPK__CACHE_BLOBS = 2,
  DSPK__CACHE_NKINDS = 3
};
#define DSPK__CACHE_MASK(kind) (1u << (kind))
#define DSPK__CACHE_ALL 7u

/* "kernels", "autotune", "blobs"; NULL for an unknown kind. */
const char *dspk__cache_kind_name(int kind);
/* The kind named by name[0..len) ("kernels", "autotune", "blobs"), or
 * DSPK_EINVAL.  For parsing cache.clear's params. */
int dspk__cache_kind_from_name(const char *name, size_t len);

struct dspk__cache_kstats {
  uint64_t entries;     /* rows in the file */
  uint64_t bytes;       /* payload + key bytes of those rows */
  uint64_t stored_hits; /* sum of the per-entry hit counters in the file */
  uint64_t hits;        /* this process, since open */
  uint64_t misses;      /* this process, since open */
  uint64_t puts;        /* this process, since open */
  uint64_t evictions;   /* this process, since open */
  uint64_t put_errors;  /* puts that failed (disk full, I/O error), since open */
};
struct dspk__cache_stats {
  struct dspk__cache_kstats kind[DSPK__CACHE_NKINDS];
  uint64_t max_bytes;
  uint64_t file_bytes; /* size of the database file and its -wal (0 in memory) */
  int in_memory;
};

/* Fills *out.  Returns 0 or a negative dspk_errno. */
int dspk__cache_stats(struct dspk__cache *c, struct dspk__cache_stats *out);
/* Deletes every entry of the kinds in mask (DSPK__CACHE_MASK bits), all
 * or none (one transaction).  Returns 0 or a negative dspk_errno; on a
 * failure in the database, why (when not NULL) says what failed and SQLite's
 * reason, and the system's under it when there is one, e.g. "COMMIT:
 * database or disk is full (No space left on device)". */
int dspk__cache_clear(struct dspk__cache *c, unsigned mask, char *why, size_t whylen);

/* Runs PRAGMA quick_check on the open database.  Returns 0 when it is
 * consistent, DSPK_EIO when not, or another negative dspk_errno. */
int dspk__cache_check(struct dspk__cache *c);
/* A value unique in this process to this open cache and to the current
 * generation of its autotune decisions: it changes when
 * dspk__cache_clear() removes them.  In-process memos of decisions (the
 * autotune framework) compare it to know when to forget.  0 for NULL. */
uint64_t dspk__cache_epoch(const struct dspk__cache *c);
/* The counters of this process (hits, misses, puts, evictions) of every
 * kind into out[DSPK__CACHE_NKINDS], the rest zero; never waits on the file
 * or the cache's lock, so an event loop may call it.  c may be NULL (all
 * zero). */
void dspk__cache_counts(struct dspk__cache *c, struct dspk__cache_kstats *out);
/* Records a use of the decision for k served from a caller's in-process
 * memo (the autotune framework remembers decisions), as a hit from the file
 * would be: counted in hits at once, and the stored entry's hits, last_used
 * and tick updated, so that the size bound evicts what was least recently
 * used and stored_hits stays truthful.  No write per use: the uses are
 * kept in memory (one row per entry, up to 64) and written in one
 * transaction at the next put (before it evicts), at dspk__cache_stats, at
 * dspk__cache_close, or when 64 other entries are waiting.  Best effort:
 * a busy or full file loses them (only recency).  c NULL: nothing. */
void dspk__cache_tune_used(struct dspk__cache *c, const struct dspk__tune_key *k);
/* The key under which dspk__cache_kernel_put stores k: a memo of compiled
 * kernels keeps it to report uses with dspk__cache_kernel_used. */
void dspk__cache_kernel_id(const struct dspk__kernel_key *k, char id[DSPK__HASH_HEX]);
/* As dspk__cache_tune_used, for the kernel stored under id (from
 * dspk__cache_kernel_id; "" or NULL: nothing) that a caller's memo served
 * (a loaded module, a pipeline). */
void dspk__cache_kernel_used(struct dspk__cache *c, const char *id);
/* As dspk__cache_tune_used, for the blob called name that a caller's memo
 * served (a plan made from it, wisdom imported from it). */
void dspk__cache_blob_used(struct dspk__cache *c, const char *name);

#endif /* DSPK_CACHE_CACHE_H */
