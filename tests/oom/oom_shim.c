/*
 * Allocation-failure injection for tests/oom (test builds only: this
 * library is never linked into dspkd; oom_test.py loads it with LD_PRELOAD).
 *
 * It wraps malloc, calloc, realloc, posix_memalign and aligned_alloc.  Each
 * time the process accepts a connection (accept4, which libuv uses), it
 * reads a number N from the file named by $DSPK_OOM_CTL and re-arms: the Nth
 * allocation counted from that accept fails (returns NULL, errno ENOMEM),
 * once; with "N+" in the file the Nth and every later one fail, until the
 * next accept; N = 0 disarms.  At the same moment it writes how many allocations
 * the previous armed period counted to $DSPK_OOM_CTL.count, so the test
 * knows how many N there are to try.
 *
 * Only allocations called from dspkd's own code (the executable, with the
 * project's static libraries), libuv and msgpack-c count and may fail:
 * third-party compute libraries (FFTW, OpenBLAS) abort on a failed
 * allocation by design, which no daemon can turn into an error answer.
 * The shim itself never allocates: it uses raw system calls and a small
 * static arena while dlsym() resolves the real functions.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <limits.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

static void *(*real_malloc)(size_t);
static void *(*real_calloc)(size_t, size_t);
static void *(*real_realloc)(void *, size_t);
static void (*real_free)(void *);
static int (*real_posix_memalign)(void **, size_t, size_t);
static void *(*real_aligned_alloc)(size_t, size_t);
static int (*real_accept4)(int, struct sockaddr *, socklen_t *, int);

/* dlsym may allocate before the real functions are known. */
static _Alignas(16) char arena[8192];
static size_t arena_used;
static int resolving;

static atomic_long countdown; /* fail when it reaches 0; <= 0 before: off */
static atomic_long counted;   /* counted allocations since the last arm */
static atomic_int armed;
static atomic_int persist;    /* every allocation from the Nth on fails */

/* Address ranges whose allocations count: the executable, libuv, msgpack. */
struct range {
  uintptr_t lo, hi, base;
  const char *name;
};
static struct range ranges[32];
static int nranges;

static void resolve(void) {
  if (real_malloc || resolving)
    return;
  resolving = 1;
  real_malloc = (void *(*)(size_t))dlsym(RTLD_NEXT, "malloc");
  real_calloc = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "calloc");
  real_realloc = (void *(*)(void *, size_t))dlsym(RTLD_NEXT, "realloc");
  real_free = (void (*)(void *))dlsym(RTLD_NEXT, "free");
  real_posix_memalign = (int (*)(void **, size_t, size_t))dlsym(RTLD_NEXT, "posix_memalign");
  real_aligned_alloc = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "aligned_alloc");
  real_accept4 = (int (*)(int, struct sockaddr *, socklen_t *, int))dlsym(RTLD_NEXT, "accept4");
  resolving = 0;
}

static void *arena_alloc(size_t n) {
  size_t at = (arena_used + 15) & ~(size_t)15;
  if (at + n > sizeof arena)
    return NULL;
  arena_used = at + n;
  return arena + at;
}

static int in_arena(const void *p) {
  return (const char *)p >= arena && (const char *)p < arena + sizeof arena;
}

static int add_range(struct dl_phdr_info *info, size_t size, void *data) {
  (void)size;
  (void)data;
  const char *name = info->dlpi_name;
  int want = !name || !*name || strstr(name, "libuv") || strstr(name, "libmsgpack");
  if (!want)
    return 0;
  for (int i = 0; i < info->dlpi_phnum && nranges < 32; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X)) {
      ranges[nranges].lo = info->dlpi_addr + ph->p_vaddr;
      ranges[nranges].hi = info->dlpi_addr + ph->p_vaddr + ph->p_memsz;
      ranges[nranges].base = info->dlpi_addr;
      ranges[nranges].name = name && *name ? name : "dspkd";
      nranges++;
    }
  }
  return 0;
}

/* 1 when this allocation (called from ra) is the one to fail. */
static int should_fail(const void *ra) {
  uintptr_t a = (uintptr_t)ra;
  int mine = -1;
  if (!atomic_load_explicit(&armed, memory_order_relaxed))
    return 0;
  for (int i = 0; i < nranges; i++)
    if (a >= ranges[i].lo && a < ranges[i].hi)
      mine = i;
  if (mine < 0)
    return 0;
  atomic_fetch_add(&counted, 1);
  long left = atomic_fetch_sub(&countdown, 1);
  if (left < 1 && atomic_load(&persist) && left > LONG_MIN / 2)
    return 1;
  if (left == 1) {
    /* "oom_shim: failing an allocation from OBJECT+0xOFFSET" for
     * addr2line -e OBJECT OFFSET. */
    char line[512], *p = line;
    const char *pre = "oom_shim: failing an allocation from ";
    uintptr_t off = a - ranges[mine].base - 1;
    char hex[20];
    int nh = 0;
    size_t nl;
    memcpy(p, pre, strlen(pre));
    p += strlen(pre);
    nl = strlen(ranges[mine].name);
    if (nl > 400)
      nl = 400;
    memcpy(p, ranges[mine].name, nl);
    p += nl;
    *p++ = '+';
    *p++ = '0';
    *p++ = 'x';
    do {
      hex[nh++] = "0123456789abcdef"[off & 15];
      off >>= 4;
    } while (off);
    while (nh)
      *p++ = hex[--nh];
    *p++ = '\n';
    ssize_t w = write(2, line, (size_t)(p - line));
    (void)w;
    return 1;
  }
  return 0;
}

EXPORT void *malloc(size_t n) {
  resolve();
  if (!real_malloc)
    return arena_alloc(n);
  if (should_fail(__builtin_return_address(0))) {
    errno = ENOMEM;
    return NULL;
  }
  return real_malloc(n);
}

EXPORT void *calloc(size_t n, size_t m) {
  resolve();
  if (!real_calloc) {
    void *p = n && m > SIZE_MAX / n ? NULL : arena_alloc(n * m);
    return p; /* the arena is zeroed static memory */
  }
  if (should_fail(__builtin_return_address(0))) {
    errno = ENOMEM;
    return NULL;
  }
  return real_calloc(n, m);
}

EXPORT void *realloc(void *p, size_t n) {
  resolve();
  if (in_arena(p) || !real_realloc) {
    void *q = real_malloc ? real_malloc(n) : arena_alloc(n);
    if (q && p) {
      size_t avail = (size_t)(arena + sizeof arena - (char *)p);
      memcpy(q, p, n < avail ? n : avail);
    }
    return q;
  }
  if (should_fail(__builtin_return_address(0))) {
    errno = ENOMEM;
    return NULL;
  }
  return real_realloc(p, n);
}

EXPORT void free(void *p) {
  if (!p || in_arena(p))
    return;
  resolve();
  real_free(p);
}

EXPORT int posix_memalign(void **out, size_t align, size_t n) {
  resolve();
  if (should_fail(__builtin_return_address(0)))
    return ENOMEM;
  return real_posix_memalign(out, align, n);
}

EXPORT void *aligned_alloc(size_t align, size_t n) {
  resolve();
  if (should_fail(__builtin_return_address(0))) {
    errno = ENOMEM;
    return NULL;
  }
  return real_aligned_alloc(align, n);
}

/* Writes v and a newline to path (no stdio: it would allocate). */
static void write_count(const char *path, long v) {
  char buf[32], *e = buf + sizeof buf, *s = e;
  int fd;
  *--s = '\n';
  do {
    *--s = (char)('0' + v % 10);
    v /= 10;
  } while (v && s > buf);
  fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd >= 0) {
    ssize_t w = write(fd, s, (size_t)(e - s));
    (void)w;
    close(fd);
  }
}

static void rearm(void) {
  const char *ctl = getenv("DSPK_OOM_CTL");
  char buf[32], path[4096];
  long n = 0;
  ssize_t r;
  int fd;

  if (!ctl)
    return;
  if (!nranges)
    dl_iterate_phdr(add_range, NULL);
  atomic_store(&armed, 0);
  if (strlen(ctl) + 7 < sizeof path) {
    memcpy(path, ctl, strlen(ctl));
    memcpy(path + strlen(ctl), ".count", 7);
    write_count(path, atomic_load(&counted));
  }
  fd = open(ctl, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return;
  r = read(fd, buf, sizeof buf - 1);
  close(fd);
  ssize_t i = 0;
  for (; i < r && buf[i] >= '0' && buf[i] <= '9'; i++)
    n = n * 10 + (buf[i] - '0');
  atomic_store(&persist, n > 0 && i < r && buf[i] == '+');
  atomic_store(&counted, 0);
  atomic_store(&countdown, n);
  atomic_store(&armed, 1); /* counting even when n == 0, for the count file */
}

EXPORT int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags) {
  int r;
  resolve();
  r = real_accept4(fd, addr, len, flags);
  if (r >= 0)
    rearm();
  return r;
}
