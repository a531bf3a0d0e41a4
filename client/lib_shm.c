/*
 * libdspkclient's shared memory (docs/protocol.md, "Shared memory"): memfds
 * sealed against shrinking and growing, mapped here and imported by the
 * daemon with buffer.import (the fd goes with the request's first byte).
 *
 * The caller's allocations (dspk_shared_alloc) are zero-copy operands: an
 * inline tensor whose data lies in one is sent as a reference.  Other
 * inline operands of at least c->shm_threshold bytes are copied once into a
 * temporary shared buffer instead of being written to the socket (where the
 * daemon would read them into its own buffer and copy them again).  A
 * temporary belongs to its task until that task's answer is consumed
 * (dspk_wait), then it is kept for the next task (at most SHM_IDLE_MAX idle
 * ones of at most c->shm_idle_bytes together, the most recently used; the
 * others are freed then), so a stream of tasks reuses the same pages instead
 * of faulting in fresh ones.  Only dspk_run makes temporaries (a
 * buffer.import round trip); dspk_submit, which never waits for an answer,
 * takes an idle one or sends the bytes inline.  Temporaries are daemon
 * buffers of the user's: they count toward max_buffers and the memory
 * quotas, hence the bound; and
 * an allocation the daemon refuses for a limit (ELIMIT, ENOMEM) frees the
 * idle ones and is tried once more.
 *
 * A result the daemon wrote into a temporary is not copied out of it: the
 * temporary is lent to the dspk_result (its data points into the mapping)
 * until dspk_result_free, which gives it back for the next task (at most
 * SHM_LENT_MAX lent per client; beyond that results cross the socket, or are
 * copied out of a temporary where they cannot, so a caller who keeps many
 * results does not pin as many daemon buffers; lent ones count toward
 * SHM_IDLE_MAX, which bounds them once freed).  A lease
 * outlives dspk_close: the result's pages stay mapped until it is freed.
 * Leases are process-wide (dspk_result_free has no client), under lease_mu.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/lib_internal.h"
#include "proto/schema.h"
#include "proto/testhook.h"
#include "proto/utf8.h"

#define SHM_IDLE_MAX 6
/* SHM_IDLE_BYTES (lib_internal.h): idle temporaries kept, together, at most */
#define SHM_LENT_MAX 4
#define SHM_ROUND ((size_t)2 << 20) /* temporaries: whole 2 MiB */

/* A temporary lent to a result: `returned` once dspk_result_free gave it
 * back, `orphan` once its client was closed (then the free unmaps it). */
struct dspk__lease {
  char *ptr;      /* NULL once `unmapped` */
  size_t size;
  bool returned, orphan;
  bool unmapped;  /* returned and larger than keep_max: unmapped then */
  size_t keep_max; /* its client's shm_idle_bytes when lent */
  void *map;      /* a file's mapping holding ptr (dspk__file_lease), else NULL */
  size_t map_len;
  struct dspk__lease *next;
};
static pthread_mutex_t lease_mu = PTHREAD_MUTEX_INITIALIZER;
static struct dspk__lease *leases;

/* Caller holds lease_mu. */
static void lease_unlink(struct dspk__lease *l) {
  for (struct dspk__lease **pp = &leases; *pp; pp = &(*pp)->next)
    if (*pp == l) {
      *pp = l->next;
      return;
    }
}

int dspk__shm_lease_return(const void *p) {
  struct dspk__lease *l;
  if (!p)
    return 0;
  pthread_mutex_lock(&lease_mu);
  for (l = leases; l && l->ptr != p; l = l->next)
    ;
  if (l && l->map) {
    lease_unlink(l);
    munmap(l->map, l->map_len);
    free(l);
  } else if (l && l->orphan) {
    lease_unlink(l);
    munmap(l->ptr, l->size);
    free(l);
  } else if (l) {
    l->returned = true;
    if (l->size > l->keep_max) {
      /* Never kept idle (dspk__shm_trim): its pages go now, its daemon
       * buffer at its client's next wait. */
      munmap(l->ptr, l->size);
      l->ptr = NULL;
      l->unmapped = true;
    }
  }
  pthread_mutex_unlock(&lease_mu);
  return l != NULL;
}

char *dspk__file_lease(void *map, size_t map_len, char *data) {
  struct dspk__lease *l = calloc(1, sizeof(*l));
  if (!l)
    return NULL;
  l->ptr = data;
  l->map = map;
  l->map_len = map_len;
  pthread_mutex_lock(&lease_mu);
  l->next = leases;
  leases = l;
  pthread_mutex_unlock(&lease_mu);
  return data;
}

void dspk__land_free(void *p) {
  if (p && !dspk__shm_lease_return(p))
    free(p);
}

/* Temporaries whose results were freed are idle again. */
static void leases_reclaim(dspk_client *c) {
  bool any = false;
  for (size_t i = 0; i < c->nshm && !any; i++)
    any = c->shm[i].state == 4;
  if (!any)
    return;
  pthread_mutex_lock(&lease_mu);
  for (size_t i = 0; i < c->nshm; i++) {
    struct dspk__shm *s = &c->shm[i];
    if (s->state == 4 && s->lease->returned) {
      s->unmapped = s->lease->unmapped;
      lease_unlink(s->lease);
      free(s->lease);
      s->lease = NULL;
      s->state = 2;
      s->used = ++c->shm_clock;
    }
  }
  pthread_mutex_unlock(&lease_mu);
}

/* The temporaries lent to results not freed yet (those freed are idle
 * again first). */
static size_t shm_lent(dspk_client *c) {
  size_t lent = 0;
  leases_reclaim(c);
  for (size_t i = 0; i < c->nshm; i++)
    lent += c->shm[i].state == 4;
  return lent;
}

char *dspk__shm_lend(dspk_client *c, uint32_t ticket, uint64_t id, uint64_t off, size_t n) {
  if (shm_lent(c) >= SHM_LENT_MAX || off != 0)
    return NULL;
  for (size_t i = 0; i < c->nshm; i++) {
    struct dspk__shm *s = &c->shm[i];
    if (s->state == 1 && s->ticket == ticket && s->id == id) {
      struct dspk__lease *l;
      if (n > s->size || !(l = calloc(1, sizeof *l)))
        return NULL;
      l->ptr = s->ptr;
      l->size = s->size;
      l->keep_max = c->shm_idle_bytes;
      pthread_mutex_lock(&lease_mu);
      l->next = leases;
      leases = l;
      pthread_mutex_unlock(&lease_mu);
      s->lease = l;
      s->state = 4;
      return s->ptr;
    }
  }
  return NULL;
}

struct import_args {
  const char *device;
  size_t size;
};

static void pack_import(void *ud, struct dspk__wbuf *w) {
  struct import_args *a = ud;
  msgpack_pack_map(&w->pk, 2);
  dspk__pack_str(&w->pk, "device");
  dspk__pack_str(&w->pk, a->device);
  dspk__pack_str(&w->pk, "size");
  msgpack_pack_uint64(&w->pk, a->size);
}

static int buffer_free(dspk_client *c, uint64_t id) {
  return dspk_buffer_free(c, id);
}

/* buffer.free on a cleanup path (after a failure, or of a temporary):
 * keeps c->err, which its success would clear, so that the failure being
 * reported keeps its message (dspk.h: never "" after a failure). */
static void buffer_free_keep_err(dspk_client *c, uint64_t id) {
  char err[sizeof c->err];
  memcpy(err, c->err, sizeof err);
  (void)buffer_free(c, id);
  memcpy(c->err, err, sizeof err);
}

/* Copies n bytes of file src from offset off, by the kernel: into the
 * mapping p with pread when p is not NULL, else into memfd fd with sendfile
 * (page cache to shmem, no mapping written through here, which on some
 * machines costs several times the copy).  0, an errno value, or -1 when
 * the file ends before offset + n. */
static int fill_from(int fd, char *p, int src, uint64_t off, size_t n) {
  off_t o = (off_t)off;
  size_t done = 0;
  while (done < n) {
    ssize_t k = p ? pread(src, p + done, n - done, (off_t)(off + done))
                  : sendfile(fd, src, &o, n - done);
    if (k < 0 && errno == EINTR)
      continue;
    if (k < 0)
      return errno;
    if (k == 0) /* the file is shorter than asked */
      return -1;
    done += (size_t)k;
  }
  return 0;
}

/* Whether this host gives shared memory 2 MiB pages only to mappings that
 * ask (transparent_hugepage/shmem_enabled "advise"): then pages made by a
 * write to the memfd (sendfile) are 4 KiB ones, and only pages faulted
 * through an advised mapping are huge. */
static bool shmem_huge_on_advice(void) {
  char line[128];
  bool advise = false;
  FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "re");
  if (!f)
    return false;
  if (fgets(line, sizeof line, f))
    advise = strstr(line, "[advise]") != NULL;
  fclose(f);
  return advise;
}

/* A sealed memfd of n bytes mapped here and imported on device; with src
 * >= 0 its bytes come from file src at offset off (else zeros).  The
 * mapping asks for huge pages before its first fault.  A file's bytes are
 * copied by the kernel: by sendfile into the memfd (no mapping written
 * through here, which on a VM with 4 KiB pages cost several times the
 * copy), or, where only advised mappings get huge pages, by pread into the
 * mapping once it is populated. */
static int shm_new_from(dspk_client *c, const char *device, size_t n, int state, int src,
                        uint64_t off, struct dspk__shm **out) {
  struct import_args a = {.device = device, .size = n};
  struct dspk__wbuf w;
  struct dspk__resp r;
  struct dspk__shm *s;
  uint32_t msgid;
  uint64_t id = 0;
  void *p = MAP_FAILED;
  bool via_map;
  struct dspk__nofsz g;
  int fd, rc, e;

  if ((rc = dspk__forked(c)) != 0)
    return rc;
  if (c->nshm == c->capshm) {
    size_t cap = c->capshm ? 2 * c->capshm : 8;
    struct dspk__shm *ns = realloc(c->shm, cap * sizeof(*ns));
    if (!ns)
      return dspk__cerr(c, DSPK_ENOMEM, "out of memory");
    c->shm = ns;
    c->capshm = cap;
  }
  fd = memfd_create("dspk-shared", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  /* No descriptor left is a limit, as the Python client says it
   * (docs/python.md; probe 20 D4: ENOMEM here, LimitExceeded there). */
  if (fd < 0 && (errno == EMFILE || errno == ENFILE))
    return dspk__cerr(c, DSPK_ELIMIT, "shared memory: memfd_create: %s (%s)", strerror(errno),
                      errno == EMFILE ? "this process's open file limit, RLIMIT_NOFILE"
                                      : "the system's open file limit");
  /* No memfd to be had here: a kernel without memfd_create or without
   * sealing (ENOSYS, EINVAL, EOPNOTSUPP) is DSPK_ENOTSUP, a seccomp filter
   * or security policy that forbids it (EPERM, EACCES) DSPK_EPERM, as the
   * Python client says them (docs/python.md): not "out of memory", which
   * freeing memory would cure (probe 23 B3). */
  if (fd < 0 && (errno == ENOSYS || errno == EINVAL || errno == EOPNOTSUPP))
    return dspk__cerr(c, DSPK_ENOTSUP, "shared memory is unavailable on this system "
                      "(memfd_create: %s)", strerror(errno));
  if (fd < 0 && (errno == EPERM || errno == EACCES))
    return dspk__cerr(c, DSPK_EPERM, "shared memory is unavailable to this process "
                      "(memfd_create: %s; a seccomp filter or security policy forbids it)",
                      strerror(errno));
  if (fd < 0)
    return dspk__cerr(c, DSPK_ENOMEM, "shared memory: memfd_create: %s", strerror(errno));
  dspk__nofsz_begin(&g);
  rc = n > (size_t)INT64_MAX ? (errno = EFBIG, -1) : ftruncate(fd, (off_t)n);
  e = errno;
  dspk__nofsz_end(&g);
  if (rc != 0) {
    struct rlimit rl;
    if (e == EFBIG && getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        (uint64_t)n > (uint64_t)rl.rlim_cur)
      rc = dspk__cerr(c, DSPK_ELIMIT, "shared memory of %zu byte%s: more than this process's "
                      "file size limit (RLIMIT_FSIZE, %llu byte%s)", n, dspk__s(n),
                      (unsigned long long)rl.rlim_cur, dspk__s(rl.rlim_cur));
    else
      rc = dspk__cerr(c, DSPK_ENOMEM, "shared memory of %zu byte%s: %s", n, dspk__s(n),
                      strerror(e));
    close(fd);
    return rc;
  }
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
    /* A memfd that takes no seals (a kernel without them): the daemon
     * imports only sealed ones (protocol.md, buffer.import). */
    rc = dspk__cerr(c, DSPK_ENOTSUP, "shared memory is unavailable on this system (sealing "
                    "a memfd: %s)", strerror(errno));
    close(fd);
    return rc;
  }
  if ((p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
    /* Before the daemon is asked: more than this process can map (its
     * address space: 2^47 bytes on x86-64 with 4-level page tables, less
     * what is mapped already, or RLIMIT_AS). */
    rc = dspk__cerr(c, DSPK_ENOMEM, "shared memory of %zu byte%s: more than this process can "
                    "map (mmap: %s)", n, dspk__s(n), strerror(errno));
    close(fd);
    return rc;
  }
  /* Huge pages where shmem_enabled allows them ("advise"): the advice must
   * come before the first fault (a MAP_POPULATE mapping would already hold
   * 4 KiB pages). */
  (void)madvise(p, n, MADV_HUGEPAGE);
  /* The daemon sees the memory first: a size above its device's memory or
   * the user's quota is refused (ENOMEM, ELIMIT) before a page of it exists
   * (filling it first committed all of it, and a size the daemon would
   * refuse could bring the host's out-of-memory killer instead). */
  for (int again = 0;; again++) {
    msgid = dspk__next_id(c);
    dspk__wbuf_init(&w);
    dspk__pack_request_head(&w.pk, msgid, "buffer.import", true);
    pack_import(&a, &w);
    rc = dspk__send_fd(c, &w, msgid, fd);
    dspk__wbuf_free(&w);
    if (rc == 0 && (rc = dspk__wait(c, msgid, &r)) == DSPK_ETIMEDOUT)
      dspk__abandon(c, msgid, true); /* the buffer it makes late is freed */
    /* Refused for a limit that idle temporaries count toward: they go, and
     * the import is tried once more. */
    if (again || (rc != DSPK_ELIMIT && rc != DSPK_ENOMEM) || !dspk__shm_drop_idle(c))
      break;
  }
  if (rc != 0) {
    munmap(p, n);
    close(fd);
    return rc;
  }
  {
    struct dspk__pval v[DSPK__MAX_PARAMS];
    char why[256];
    if ((rc = dspk__result_decode(&dspk__methods[DSPK__M_BUFFER_IMPORT], r.msg.result, v, why,
                                  sizeof why)) < 0)
      rc = dspk__cerr(c, rc, "%s", why);
    else
      id = v[DSPK__R_BUF_BUFFER].v.u;
  }
  dspk__resp_free(&r);
  if (rc != 0) {
    munmap(p, n);
    close(fd);
    return rc;
  }
  /* test hook: the mapped path on any host (tests/client_lib/test_shared) */
  via_map = src >= 0 && (shmem_huge_on_advice() || DSPK_TEST_HOOK("DSPK_TEST_SHM_FILL_MAP"));
  if (src < 0 || via_map)
    (void)madvise(p, n, MADV_POPULATE_WRITE);
  if (src >= 0) {
    dspk__nofsz_begin(&g);
    rc = fill_from(fd, via_map ? p : NULL, src, off, n);
    dspk__nofsz_end(&g);
  }
  if (src >= 0 && rc != 0) {
    /* A device that reads at no offset (a terminal, ESPIPE from pread;
     * EINVAL from sendfile) is the caller's descriptor, as a pipe is
     * (from_file_fd_check); other errors are the file's I/O. */
    if (rc == ESPIPE || rc == EINVAL)
      rc = dspk__argerr(c, "dspk_shared_from_file: fd %d cannot be read at an offset (%s); "
                        "it takes a descriptor open for reading of a regular file, or of a "
                        "device such as /dev/zero", src, strerror(rc));
    else if (rc < 0)
      rc = dspk__cerr(c, DSPK_EIO, "reading %zu byte%s at offset %llu of file descriptor %d "
                      "into shared memory: the file ends before offset %llu", n, dspk__s(n),
                      (unsigned long long)off, src, (unsigned long long)off + n);
    else
      rc = dspk__cerr(c, DSPK_EIO, "reading %zu byte%s at offset %llu of file descriptor %d "
                      "into shared memory: %s", n, dspk__s(n), (unsigned long long)off, src,
                      strerror(rc));
    buffer_free_keep_err(c, id);
    munmap(p, n);
    close(fd);
    return rc;
  }
  close(fd);
  s = &c->shm[c->nshm++];
  memset(s, 0, sizeof *s);
  s->ptr = p;
  s->size = n;
  s->id = id;
  s->state = state;
  snprintf(s->device, sizeof s->device, "%s", device);
  *out = s;
  return 0;
}

static int shm_new(dspk_client *c, const char *device, size_t n, int state,
                   struct dspk__shm **out) {
  return shm_new_from(c, device, n, state, -1, 0, out);
}

static void shm_drop(dspk_client *c, size_t i, bool tell) {
  struct dspk__shm s = c->shm[i];
  memmove(&c->shm[i], &c->shm[i + 1], (c->nshm - i - 1) * sizeof(c->shm[0]));
  c->nshm--;
  if (tell && !c->broken && !s.freed) /* freed: the caller's dspk_buffer_free did */
    buffer_free_keep_err(c, s.id); /* requests already sent still see it */
  if (!s.unmapped)
    munmap(s.ptr, s.size);
}

void dspk__shm_freed(dspk_client *c, uint64_t id) {
  for (size_t i = 0; id && i < c->nshm; i++)
    if (c->shm[i].id == id) {
      c->shm[i].freed = true;
      if (c->shm[i].state == 2) /* an idle temporary: of no more use */
        shm_drop(c, i, false);
      return;
    }
}

DSPK_EXPORT int dspk_shared_alloc(dspk_client *c, const char *device,
                                  size_t bytes, void **ptr_out,
                                  uint64_t *id_out) {
  struct dspk__shm *s;
  int rc;
  if (!c || !ptr_out || !id_out)
    return dspk__argerr(c, "dspk_shared_alloc: %s is NULL", !ptr_out ? "ptr_out" : "id_out");
  if (bytes == 0)
    return dspk__argerr(c, "dspk_shared_alloc: bytes must be > 0");
  /* The memory is a file (a memfd): no file holds more (EFBIG from
   * ftruncate read as "File too large", the RLIMIT_FSIZE case's words). */
  if ((uint64_t)bytes > (uint64_t)INT64_MAX)
    return dspk__argerr(c, "dspk_shared_alloc: bytes %zu passes a file's largest size "
                        "(2^63-1)", bytes);
  rc = shm_new(c, device ? device : "cpu:0", bytes, 0, &s);
  if (rc != 0)
    return rc;
  *ptr_out = s->ptr;
  *id_out = s->id;
  return 0;
}

/* What dspk_shared_from_file reads: a descriptor open for reading of a
 * file that reads at an offset (pread, sendfile), a regular file or a
 * device such as /dev/zero or a disk.  Every other kind is DSPK_EINVAL,
 * named, before a memfd is made or the daemon asked (the copy failed with
 * the kernel's words only, DSPK_EIO "Illegal seek" for a pipe, "Bad file
 * descriptor" for a write-only one: probe 23 B2).  0 or DSPK_EINVAL. */
static int from_file_fd_check(dspk_client *c, int fd) {
  static const char takes[] = "it takes a descriptor open for reading "
                              "of a file that can be read at an offset (a regular file, or "
                              "a device such as /dev/zero)";
  const char *kind = NULL;
  struct stat st;
  int fl = fcntl(fd, F_GETFL);

  if (fl < 0 || fstat(fd, &st) != 0)
    return dspk__argerr(c, "dspk_shared_from_file: fd %d is not an open file descriptor; %s",
                        fd, takes);
  if (fl & O_PATH)
    return dspk__argerr(c, "dspk_shared_from_file: fd %d was opened with O_PATH, which reads "
                        "nothing; %s", fd, takes);
  if (S_ISDIR(st.st_mode))
    kind = "is a directory";
  else if (S_ISFIFO(st.st_mode))
    kind = "is a pipe or FIFO, which cannot be read at an offset";
  else if (S_ISSOCK(st.st_mode))
    kind = "is a socket, which cannot be read at an offset";
  else if ((fl & O_ACCMODE) == O_WRONLY)
    kind = "is open for writing only";
  if (kind)
    return dspk__argerr(c, "dspk_shared_from_file: fd %d %s; %s", fd, kind, takes);
  return 0;
}

DSPK_EXPORT int dspk_shared_from_file(dspk_client *c, const char *device, int fd,
                                      uint64_t offset, size_t bytes, void **ptr_out,
                                      uint64_t *id_out) {
  struct dspk__shm *s;
  int rc;
  if (!c || !ptr_out || !id_out)
    return dspk__argerr(c, "dspk_shared_from_file: %s is NULL", !ptr_out ? "ptr_out" : "id_out");
  if (fd < 0)
    return dspk__argerr(c, "dspk_shared_from_file: fd %d is no file", fd);
  if (bytes == 0)
    return dspk__argerr(c, "dspk_shared_from_file: bytes must be > 0");
  if (offset > (uint64_t)INT64_MAX || (uint64_t)bytes > (uint64_t)INT64_MAX - offset)
    return dspk__argerr(c, "dspk_shared_from_file: offset %llu + bytes %zu passes a file's "
                        "largest offset (2^63-1)", (unsigned long long)offset, bytes);
  if ((rc = from_file_fd_check(c, fd)) != 0)
    return rc;
  rc = shm_new_from(c, device ? device : "cpu:0", bytes, 0, fd, offset, &s);
  if (rc != 0)
    return rc;
  *ptr_out = s->ptr;
  *id_out = s->id;
  return 0;
}

DSPK_EXPORT int dspk_shared_free(dspk_client *c, void *ptr) {
  if (!c)
    return DSPK_EINVAL;
  if (dspk__forked(c)) /* the allocation stays the parent's */
    return DSPK_ECLOSED;
  for (size_t i = 0; i < c->nshm; i++)
    if (c->shm[i].ptr == ptr && c->shm[i].state == 0) {
      uint64_t id = c->shm[i].id;
      int rc = c->broken ? 0 : buffer_free(c, id);
      c->shm[i].id = 0;
      shm_drop(c, i, false);
      return rc;
    }
  return dspk__cerr(c, DSPK_EINVAL, "dspk_shared_free: not a shared allocation");
}

DSPK_EXPORT void dspk_set_shared_threshold(dspk_client *c, size_t bytes) {
  if (c)
    c->shm_threshold = bytes;
}

bool dspk__shm_quota_stops(const dspk_client *c, const char *device, size_t n,
                           uint64_t task_bytes) {
  uint64_t held = 0, q = c->cpu_quota, rest = task_bytes > n ? task_bytes - n : 0;
  uint64_t want = ((uint64_t)n + SHM_ROUND - 1) / SHM_ROUND * SHM_ROUND;
  if (strcmp(device, "cpu:0") != 0)
    return false;
  for (size_t i = 0; i < c->nshm; i++)
    if (strcmp(c->shm[i].device, "cpu:0") == 0)
      held += c->shm[i].size;
  return held > q || want > q - held || rest > q - held - want;
}

/* A temporary of at least n bytes for a task on `device`, now being filled
 * (state 3): 1 with *out, 0 when the task's device rules it out (or, without
 * may_wait, when no idle one fits: making one, or learning what "any" is,
 * waits for an answer, which dspk_submit never does), or a negative code.
 * need: the bytes cannot cross the socket (dspk__operand_needs_shm, a
 * result above dspk__result_inline_max): the call waits as with may_wait,
 * and a refused temporary is the call's failure instead of 0.  task_bytes:
 * the task's inline operands and result, these n included. */
static int shm_temp(dspk_client *c, const char *device, size_t n, uint64_t task_bytes,
                    bool may_wait, bool need, struct dspk__shm **out) {
  struct dspk__shm *best = NULL;
  size_t want;
  int rc;

  may_wait |= need;
  /* A temporary pins the task to its device.  For "any" that is right only
   * when "any" can mean nothing but cpu:0 (no hardware device: every device
   * is the cpu or a software renderer); else the daemon's choice, and its
   * move to cpu:0 on ENOTSUP, stay free and the operand goes inline. */
  if (strcmp(device, "any") == 0) {
    if (c->shm_any == 0 && !may_wait)
      return 0; /* dspk_devices would wait: inline until a dspk_run learns it */
    if (!dspk__shm_any_is_cpu(c))
      return 0;
    device = "cpu:0";
  }
  /* A temporary: the smallest idle one of this device that fits. */
  leases_reclaim(c);
  for (size_t i = 0; i < c->nshm; i++) {
    struct dspk__shm *s = &c->shm[i];
    if (s->state == 2 && !s->unmapped && !s->freed && s->size >= n &&
        strcmp(s->device, device) == 0 &&
        (!best || s->size < best->size))
      best = s;
  }
  if (!best && !may_wait)
    return 0; /* buffer.import (and buffer.free) would wait behind the device's work */
  if (!best) {
    size_t idle = 0;
    for (size_t i = 0; i < c->nshm; i++)
      idle += c->shm[i].state == 2;
    for (size_t i = 0; idle >= SHM_IDLE_MAX && i < c->nshm;) {
      if (c->shm[i].state == 2) {
        shm_drop(c, i, true);
        idle--;
      } else {
        i++;
      }
    }
    want = (n + SHM_ROUND - 1) / SHM_ROUND * SHM_ROUND;
    /* One that would pass, with the shared memory c holds there already
     * and the task's other inline bytes (task_bytes less these n, which
     * the temporary carries instead; operands already in temporaries are
     * not in it), what the connection's buffers on cpu:0 may hold (hello's
     * cpu_memory_quota) would be refused, or leave the task no room (the
     * daemon counts its inline operands and results too): the bytes cross
     * the socket, as with threshold 0.  A temporary in whole 2 MiB units
     * can pass a small quota that the bytes alone fit. */
    if (!need && dspk__shm_quota_stops(c, device, n, task_bytes))
      return 0;
    if ((rc = shm_new(c, device, want, 2, &best)) != 0) {
      /* A temporary is the library's choice, not the caller's: one that
       * cannot be had (the daemon refuses it for max_buffers or a quota,
       * its device takes no import, no memfd here) leaves the bytes to the
       * socket, as dspk_submit sends them, where they fit one message.  A
       * broken connection or a timeout stays the call's failure. */
      if (c->broken || rc == DSPK_ETIMEDOUT)
        return rc;
      /* No such device (or not the Slurm job's): the task's own refusal,
       * in the daemon's words, as the task.run would get it. */
      if (rc == DSPK_ENODEV)
        return rc;
      if (!need)
        return 0;
      char why[sizeof c->err];
      memcpy(why, c->err, sizeof why);
      return dspk__cerr(c, rc, "an operand or result of %zu bytes cannot cross the socket "
                        "(the daemon's max_message is %zu bytes) and the shared temporary "
                        "that would carry it was refused: %s", n, c->send_max, why);
    }
  }
  best->state = 3;
  *out = best;
  return 1;
}

/* Copies of at least WIDE_MIN bytes are split across up to WIDE_MAX
 * threads (the caller's and helpers started for the copy): one core does not
 * reach the memory's bandwidth, and the daemon waits for these bytes (2048^2
 * f32 operands, 32 MiB, on the 2-core development VM: 2.3 ms on one thread,
 * 1.25 ms on two). */
#define WIDE_MIN ((size_t)8 << 20)
#define WIDE_MAX 4

struct wide_part {
  char *dst;
  const char *src;
  size_t n;
};

static void *wide_copy_part(void *arg) {
  struct wide_part *w = arg;
  memcpy(w->dst, w->src, w->n);
  return NULL;
}

void dspk__copy_wide(void *dst, const void *src, size_t n, int threads) {
  struct wide_part part[WIDE_MAX];
  pthread_t th[WIDE_MAX];
  bool started[WIDE_MAX] = {false};
  int k = threads < 1 ? 1 : threads > WIDE_MAX ? WIDE_MAX : threads;

  if ((size_t)k > n / (WIDE_MIN / 2))
    k = (int)(n / (WIDE_MIN / 2)); /* at least 4 MiB a thread */
  if (k <= 1) {
    memcpy(dst, src, n);
    return;
  }
  for (int i = 0; i < k; i++) {
    /* 4 KiB-aligned parts, the last one takes the rest. */
    size_t a = n / (size_t)k * (size_t)i & ~(size_t)4095;
    size_t b = i == k - 1 ? n : n / (size_t)k * (size_t)(i + 1) & ~(size_t)4095;
    part[i] = (struct wide_part){(char *)dst + a, (const char *)src + a, b - a};
  }
  for (int i = 1; i < k; i++)
    started[i] = pthread_create(&th[i], NULL, wide_copy_part, &part[i]) == 0;
  wide_copy_part(&part[0]);
  for (int i = 1; i < k; i++) {
    if (started[i])
      pthread_join(th[i], NULL);
    else
      wide_copy_part(&part[i]); /* no thread: this one copies it */
  }
}

/* An operand into its temporary: on every core (at most WIDE_MAX) from
 * WIDE_MIN bytes. */
static void wide_copy(void *dst, const void *src, size_t n) {
  long ncpu = n < WIDE_MIN ? 1 : sysconf(_SC_NPROCESSORS_ONLN);
  dspk__copy_wide(dst, src, n, ncpu < 1 ? 1 : ncpu > WIDE_MAX ? WIDE_MAX : (int)ncpu);
}

const struct dspk__shm *dspk__shm_holding(const dspk_client *c, const void *data, size_t n) {
  const char *p = data;
  for (size_t i = 0; p && i < c->nshm; i++) {
    const struct dspk__shm *s = &c->shm[i];
    if (s->state == 0 && !s->freed && p >= s->ptr && n <= s->size &&
        (size_t)(p - s->ptr) <= s->size - n)
      return s;
  }
  return NULL;
}

int dspk__shm_operand(dspk_client *c, const char *device, const void *data, size_t n,
                      size_t isz, uint64_t task_bytes, bool may_wait, uint64_t *id,
                      uint64_t *off) {
  const char *p = data;
  struct dspk__shm *s;
  int rc;

  if (!p)
    return 0;
  for (size_t i = 0; i < c->nshm; i++) {
    s = &c->shm[i];
    if (s->state == 0 && p >= s->ptr && n <= s->size && (size_t)(p - s->ptr) <= s->size - n) {
      /* A reference the daemon would refuse (another device's buffer, an
       * offset between items, an id freed with dspk_buffer_free) is no
       * reference: the bytes go as any other. */
      if (s->freed || (size_t)(p - s->ptr) % isz != 0 ||
          (strcmp(device, "any") != 0 && strcmp(device, s->device) != 0))
        break;
      *id = s->id;
      *off = (uint64_t)(p - s->ptr);
      return 1;
    }
  }
  bool need = dspk__operand_needs_shm(c, n);
  if (!need && (!c->shm_threshold || n < c->shm_threshold))
    return 0;
  if ((rc = shm_temp(c, device, n, task_bytes, may_wait, need, &s)) != 1)
    return rc;
  /* A file's bytes (dspk_file_data, an operand too large for the socket)
   * are read from the file, never through the caller's mapping of it,
   * which faults (SIGBUS) where the file shrank. */
  const struct dspk__fmap *fm = dspk__fmap_of(c, p, n);
  rc = fm ? fill_from(-1, s->ptr, fm->fd, fm->off + (uint64_t)(p - fm->addr), n) : 0;
  if (rc == ESPIPE || rc == EINVAL || rc == EBADF) /* not readable so: as memory */
    fm = NULL;
  if (fm) {
    if (rc != 0)
      return rc < 0 ? dspk__cerr(c, DSPK_EIO, "an input file ended before its data was "
                                 "sent (changed while in use?)") /* as the sendfile path */
                    : dspk__cerr(c, DSPK_EIO, "reading an input file: %s", strerror(rc));
  } else {
    wide_copy(s->ptr, p, n);
  }
  *id = s->id;
  *off = 0;
  return 1;
}

int dspk__shm_result(dspk_client *c, const char *device, size_t n, uint64_t task_bytes,
                     bool may_wait, uint64_t *id) {
  struct dspk__shm *s;
  int rc;
  bool need = dspk__result_needs_shm(c, n);
  if (!need && (!c->shm_threshold || n < c->shm_threshold))
    return 0;
  /* While SHM_LENT_MAX results hold temporaries, the next would be copied
   * out of its temporary anyway (dspk__shm_lend): one that may cross the
   * socket does, into memory of its own, and no temporary is made (nor
   * held) for it. */
  if (!need && shm_lent(c) >= SHM_LENT_MAX)
    return 0;
  if ((rc = shm_temp(c, device, n, task_bytes, may_wait || need,
                     n > dspk__result_inline_max(c), &s)) != 1)
    return rc;
  *id = s->id;
  return 1;
}

const char *dspk__shm_of_ticket(dspk_client *c, uint32_t ticket, uint64_t id,
                                uint64_t off, size_t n) {
  for (size_t i = 0; i < c->nshm; i++) {
    struct dspk__shm *s = &c->shm[i];
    if (s->state == 1 && s->ticket == ticket && s->id == id)
      return off <= s->size && n <= s->size - off ? s->ptr + off : NULL;
  }
  return NULL;
}

char *dspk__shm_local(dspk_client *c, uint64_t id, uint64_t off, size_t n) {
  /* Keep the daemon's order of requests: also behind one given up on after
   * a timeout, which the daemon still runs (its answer not come yet). */
  if (dspk__daemon_busy(c) || c->broken)
    return NULL;
  for (size_t i = 0; i < c->nshm; i++) {
    struct dspk__shm *s = &c->shm[i];
    if (s->state == 0 && !s->freed && s->id == id)
      return off <= s->size && n <= s->size - off ? s->ptr + off : NULL;
  }
  return NULL;
}

bool dspk__shm_overlaps(const dspk_client *c, uint64_t id, const void *p, size_t n) {
  const char *q = p;
  for (size_t i = 0; q && n && i < c->nshm; i++) {
    const struct dspk__shm *s = &c->shm[i];
    if (s->state == 0 && !s->freed && s->id == id && !s->unmapped)
      return q < s->ptr + s->size && s->ptr < q + n;
  }
  return false;
}

void dspk__shm_sent(dspk_client *c, uint32_t ticket, bool ok) {
  for (size_t i = 0; i < c->nshm; i++)
    if (c->shm[i].state == 3) {
      c->shm[i].state = ok ? 1 : 2;
      c->shm[i].ticket = ticket;
    }
}

void dspk__shm_done(dspk_client *c, uint32_t ticket) {
  for (size_t i = 0; i < c->nshm; i++)
    if (c->shm[i].state == 1 && c->shm[i].ticket == ticket) {
      c->shm[i].state = 2;
      c->shm[i].used = ++c->shm_clock;
    }
}

void dspk__shm_trim(dspk_client *c) {
  uint64_t keep[SHM_IDLE_MAX]; /* buffer ids of those kept */
  size_t kept = 0, bytes = 0, lent = shm_lent(c);
  /* The most recently used first, while they fit the bounds.  Those lent
   * to results count toward SHM_IDLE_MAX: each is idle once its result is
   * freed (no trim runs then), so that the idle ones are at most
   * SHM_IDLE_MAX then too. */
  while (kept + lent < SHM_IDLE_MAX) {
    struct dspk__shm *best = NULL;
    for (size_t i = 0; i < c->nshm; i++) {
      struct dspk__shm *s = &c->shm[i];
      bool taken = false;
      for (size_t k = 0; k < kept; k++)
        taken |= keep[k] == s->id;
      if (s->state == 2 && !s->freed && !taken && (!best || s->used > best->used))
        best = s;
    }
    if (!best || bytes + best->size > c->shm_idle_bytes)
      break;
    keep[kept++] = best->id;
    bytes += best->size;
  }
  for (size_t i = 0; i < c->nshm;) {
    bool taken = false;
    for (size_t k = 0; k < kept; k++)
      taken |= keep[k] == c->shm[i].id;
    if (c->shm[i].state == 2 && !taken)
      shm_drop(c, i, true); /* requests already sent still see it */
    else
      i++;
  }
}

bool dspk__shm_any_is_cpu(dspk_client *c) {
  if (c->shm_any == 0) {
    dspk_device_list *l = NULL;
    c->shm_any = 2;
    if (dspk_devices(c, false, &l) == 0) {
      bool hw = false;
      for (size_t i = 0; i < l->ndevices; i++)
        hw |= strcmp(l->devices[i].backend, "cpu") != 0 && !l->devices[i].software;
      c->shm_any = hw ? 2 : 1;
    }
    dspk_device_list_free(l);
  }
  return c->shm_any == 1;
}

size_t dspk__shm_of_task(const dspk_client *c, uint32_t ticket) {
  size_t n = 0;
  for (size_t i = 0; ticket && i < c->nshm; i++)
    n += c->shm[i].state == 1 && c->shm[i].ticket == ticket;
  return n;
}

bool dspk__shm_has_idle(dspk_client *c) {
  leases_reclaim(c);
  for (size_t i = 0; i < c->nshm; i++)
    if (c->shm[i].state == 2)
      return true;
  return false;
}

bool dspk__shm_drop_idle(dspk_client *c) {
  bool any = false;
  leases_reclaim(c);
  for (size_t i = 0; i < c->nshm;) {
    if (c->shm[i].state == 2) {
      shm_drop(c, i, true);
      any = true;
    } else {
      i++;
    }
  }
  return any;
}

void dspk__shm_close(dspk_client *c) {
  pthread_mutex_lock(&lease_mu);
  for (size_t i = 0; i < c->nshm; i++) {
    struct dspk__shm *s = &c->shm[i];
    if (s->state == 4 && !s->lease->returned) {
      s->lease->orphan = true; /* still the result's: unmapped by its free */
      continue;
    }
    if (s->state == 4) {
      s->unmapped |= s->lease->unmapped;
      lease_unlink(s->lease);
      free(s->lease);
    }
    if (!s->unmapped)
      munmap(s->ptr, s->size);
  }
  pthread_mutex_unlock(&lease_mu);
  free(c->shm);
  c->shm = NULL;
  c->nshm = c->capshm = 0;
}
