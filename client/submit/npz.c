/*
 * numpy .npz archives for dspk-submit (npy.h: dspk__npz_load).
 *
 * An .npz is a zip archive with one .npy per array, named NAME.npy after
 * the keyword given to numpy.savez; numpy.savez stores the members,
 * numpy.savez_compressed deflates them, and both may write zip64 headers.
 * libzip reads the archive (central directory, zip64, deflate through
 * zlib, the CRC check); this file only picks the member, reads it whole
 * into memory (its declared size is allocated, and exactly that many bytes
 * must come out) and hands the image to the .npy parser, which checks it
 * like a file.
 *
 * libzip is opened on the first .npz (dlopen), not linked: most commands
 * read none, and loading it with the libcrypto it links was most of a fresh
 * dspk-submit's start-up (3,500 relocations; 17 M cycles of the dynamic
 * loader's 20 M on the 2-core VM).
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zip.h>

#include "client/submit/npy.h"
#include "client/submit/outfile.h"
#include "dspk/errors.h"

#define NPZ_ZIP_FUNCS(X)                                                       \
  X(zip_open) X(zip_discard) X(zip_error_init_with_code) X(zip_error_strerror) \
  X(zip_error_fini) X(zip_get_num_entries) X(zip_get_name)  \
  X(zip_stat_index) X(zip_strerror) X(zip_fopen_index) X(zip_fread)             \
  X(zip_file_strerror) X(zip_fclose)

/* libzip's functions, filled by zip_load. */
static struct {
  void *lib;
#define X(f) __typeof__(f) *f;
  NPZ_ZIP_FUNCS(X)
#undef X
} Z;

/* The name of entry i as numpy knows it, in UTF-8 (malloc'd; the caller
 * frees it), or NULL.  numpy reads an .npz through Python's zipfile, which
 * takes a name with the UTF-8 flag as UTF-8 and any other as cp437, whose
 * bytes 0x00-0x7F are ASCII itself: a control character stays that
 * character (numpy.savez stores 'a\x1bb' so, flagless).  libzip's
 * strict decoding (ZIP_FL_ENC_STRICT) is cp437 too, but with a glyph for
 * each control (ESC as U+2190): the name nobody can type.  So each raw
 * byte below 0x80 is kept, and each other byte takes libzip's strict
 * decoding of it (one character per byte in cp437). */
static char *numpy_name(zip_t *za, zip_uint64_t i) {
  const unsigned char *raw = (const unsigned char *)Z.zip_get_name(za, i, ZIP_FL_ENC_RAW);
  const unsigned char *dec;
  size_t rlen, dlen, k = 0, used = 0;
  char *out;

  if (raw == NULL)
    return NULL;
  rlen = strlen((const char *)raw);
  dec = (const unsigned char *)Z.zip_get_name(za, i, ZIP_FL_ENC_STRICT);
  dlen = dec != NULL ? strlen((const char *)dec) : 0;
  if (dec == NULL || (dlen == rlen && memcmp(dec, raw, rlen) == 0))
    return strdup((const char *)raw); /* UTF-8 by its flag, or printable ASCII */
  if ((out = malloc(dlen + rlen + 1)) == NULL)
    return NULL;
  for (size_t r = 0; r < rlen; r++) {
    size_t c = k + 1; /* the end of dec's character for this byte */
    while (c < dlen && (dec[c] & 0xC0) == 0x80)
      c++;
    if (k >= dlen) { /* not one character per byte: not cp437, keep the bytes */
      free(out);
      return strdup((const char *)raw);
    }
    if (raw[r] < 0x80) {
      out[used++] = (char)raw[r];
    } else {
      memcpy(out + used, dec + k, c - k);
      used += c - k;
    }
    k = c;
  }
  if (k != dlen) {
    free(out);
    return strdup((const char *)raw);
  }
  out[used] = '\0';
  return out;
}

/* Lists the arrays of the archive ("a, b, c") into buf, names as numpy
 * gives them (NAME.npy as NAME); when the list does not fit, it ends with
 * the last whole name and " and N more". */
static void list_members(zip_t *za, char *buf, size_t cap) {
  zip_int64_t n = Z.zip_get_num_entries(za, 0);
  size_t used = 0;
  buf[0] = '\0';
  for (zip_int64_t i = 0; i < n; i++) {
    char *name = numpy_name(za, (zip_uint64_t)i);
    size_t len, need;
    if (name == NULL)
      continue;
    len = strlen(name);
    if (len > 4 && strcmp(name + len - 4, ".npy") == 0)
      len -= 4;
    need = (used ? 2 : 0) + len;
    /* Room for this one, and for the tail should more follow. */
    if (used + need + (i + 1 < n ? 32 : 0) >= cap) {
      free(name);
      if (used == 0)
        snprintf(buf, cap, "%lld names too long to list", (long long)n);
      else
        snprintf(buf + used, cap - used, " and %lld more", (long long)(n - i));
      return;
    }
    snprintf(buf + used, cap - used, "%s%.*s", used ? ", " : "", (int)len, name);
    used += need;
    free(name);
  }
}

/* Whether entry i has the name name, as numpy names it. */
static int name_is(zip_t *za, zip_int64_t i, const char *name) {
  char *s = numpy_name(za, (zip_uint64_t)i);
  int same = s != NULL && strcmp(s, name) == 0;
  free(s);
  return same;
}

/* The index of the entry named name as numpy finds it, or -1.  numpy reads
 * an .npz through zipfile, whose table of names keeps the LAST entry of a
 * name that appears twice (an archive updated by appending, as zip -u and
 * zipfile's mode 'a' do); libzip's zip_name_locate answers the first. */
static zip_int64_t locate_last(zip_t *za, const char *name) {
  for (zip_int64_t i = Z.zip_get_num_entries(za, 0) - 1; i >= 0; i--)
    if (name_is(za, i, name))
      return i;
  return -1;
}

/* Whether every entry has the name of the first: one array, maybe updated. */
static int one_name(zip_t *za) {
  zip_int64_t n = Z.zip_get_num_entries(za, 0);
  char *first = n > 0 ? numpy_name(za, 0) : NULL;
  int one = first != NULL;
  for (zip_int64_t i = 1; one && i < n; i++)
    one = name_is(za, i, first);
  free(first);
  return one;
}

static int fail(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail(char *err, size_t errlen, int code, const char *fmt, ...) {
  va_list ap;
  if (err != NULL && errlen > 0) {
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return code;
}

/* Opens libzip (DSPK_LIBZIP_SONAME, the soname of the libzip built
 * against) once.  Returns 0, or DSPK_ENOTSUP with why in err. */
static int zip_load(char *err, size_t errlen) {
  void *lib;
  if (Z.lib)
    return 0;
  lib = dlopen(DSPK_LIBZIP_SONAME, RTLD_NOW | RTLD_LOCAL);
  if (!lib)
    return fail(err, errlen, DSPK_ENOTSUP, ".npz archives need libzip: %s", dlerror());
#define X(f)                                                                    \
  if (!(*(void **)&Z.f = dlsym(lib, #f))) {                                     \
    dlclose(lib);                                                               \
    return fail(err, errlen, DSPK_ENOTSUP, "%s lacks %s", DSPK_LIBZIP_SONAME, #f); \
  }
  NPZ_ZIP_FUNCS(X)
#undef X
  Z.lib = lib;
  return 0;
}

int dspk__npz_load(const char *path, const char *member, dspk__npy *out,
                   char *err, size_t errlen) {
  char names[256], full[512], label[600];
  zip_t *za;
  zip_file_t *zf = NULL;
  zip_stat_t st;
  zip_int64_t idx = -1, got;
  unsigned char *buf = NULL, extra;
  int zerr = 0, rc;

  if ((rc = zip_load(err, errlen)))
    return rc;
  {
    /* A file that cannot be opened is named as the .npy inputs name it
     * (strerror's words, not libzip's "No such file"). */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
      int e = errno;
      return fail(err, errlen, dspk__path_code(e), "%s: %s", dspk__npy_shown(path),
                  strerror(e));
    }
    close(fd);
  }
  za = Z.zip_open(path, ZIP_RDONLY, &zerr);
  if (za == NULL) {
    zip_error_t ze;
    Z.zip_error_init_with_code(&ze, zerr);
    rc = fail(err, errlen,
              zerr == ZIP_ER_NOENT                      ? DSPK_ENOENT
              : zerr == ZIP_ER_OPEN || zerr == ZIP_ER_READ ? DSPK_EIO
              : zerr == ZIP_ER_MEMORY                   ? DSPK_ENOMEM
                                                        : DSPK_EINVAL,
              "%s: %s%s", dspk__npy_shown(path), Z.zip_error_strerror(&ze),
              zerr == ZIP_ER_NOZIP ? " (an .npz is a zip archive)" : "");
    Z.zip_error_fini(&ze);
    return rc;
  }
  list_members(za, names, sizeof names);
  if (Z.zip_get_num_entries(za, 0) == 0) {
    rc = fail(err, errlen, DSPK_EINVAL, "%s: the archive holds no arrays",
              dspk__npy_shown(path));
    goto out;
  }
  if (member == NULL) {
    if (!one_name(za)) {
      rc = fail(err, errlen, DSPK_EINVAL,
                "%s: the archive holds %lld arrays (%s); name one as %s:NAME",
                dspk__npy_shown(path), (long long)Z.zip_get_num_entries(za, 0), names,
                dspk__npy_shown(path));
      goto out;
    }
    idx = Z.zip_get_num_entries(za, 0) - 1;
    /* Errors name the member as FILE.npz:NAME would (NAME.npy as NAME). */
    char *name = numpy_name(za, (zip_uint64_t)idx);
    size_t nl = name != NULL ? strlen(name) : 0;
    if (nl > 4 && strcmp(name + nl - 4, ".npy") == 0)
      nl -= 4;
    snprintf(label, sizeof label, "%s:%.*s", path, (int)nl, name != NULL ? name : "");
    free(name);
  } else {
    if (member[0] == '\0') {
      rc = fail(err, errlen, DSPK_EINVAL, "%s: empty array name after ':'",
                dspk__npy_shown(path));
      goto out;
    }
    /* numpy's order: an entry named NAME itself, else NAME.npy. */
    snprintf(full, sizeof full, "%s.npy", member);
    idx = locate_last(za, member);
    if (idx < 0)
      idx = locate_last(za, full);
    snprintf(label, sizeof label, "%s:%s", path, member);
    if (idx < 0) {
      rc = fail(err, errlen, DSPK_ENOENT, "%s: no array '%s' in the archive (it has: %s)",
                dspk__npy_shown(path), dspk__npy_shown(member), names);
      goto out;
    }
  }
  if (Z.zip_stat_index(za, (zip_uint64_t)idx, 0, &st) != 0 || !(st.valid & ZIP_STAT_SIZE)) {
    rc = fail(err, errlen, DSPK_EINVAL, "%s: %s", dspk__npy_shown(label), Z.zip_strerror(za));
    goto out;
  }
  if (st.size > SIZE_MAX - 1 || (buf = malloc(st.size ? (size_t)st.size : 1)) == NULL) {
    rc = fail(err, errlen, DSPK_ENOMEM, "%s: out of memory for %llu bytes", dspk__npy_shown(label),
              (unsigned long long)st.size);
    goto out;
  }
  zf = Z.zip_fopen_index(za, (zip_uint64_t)idx, 0);
  if (zf == NULL) {
    rc = fail(err, errlen, DSPK_EINVAL, "%s: %s", dspk__npy_shown(label), Z.zip_strerror(za));
    goto out;
  }
  for (zip_uint64_t done = 0; done < st.size; done += (zip_uint64_t)got) {
    got = Z.zip_fread(zf, buf + done, st.size - done);
    if (got <= 0) {
      rc = fail(err, errlen, DSPK_EINVAL, "%s: %s", dspk__npy_shown(label),
                got < 0 ? Z.zip_file_strerror(zf) : "member shorter than its header says");
      goto out;
    }
  }
  /* Reading past the end checks the CRC and that no bytes are left. */
  got = Z.zip_fread(zf, &extra, 1);
  if (got != 0) {
    rc = fail(err, errlen, DSPK_EINVAL, "%s: %s", dspk__npy_shown(label),
              got < 0 ? Z.zip_file_strerror(zf) : "member longer than its header says");
    goto out;
  }
  rc = dspk__npy_adopt(buf, (size_t)st.size, label, DSPK__NPY_FROM_MEMBER, out, err, errlen);
  buf = NULL; /* adopted, or freed */
out:
  free(buf);
  if (zf != NULL)
    Z.zip_fclose(zf);
  Z.zip_discard(za);
  return rc;
}
